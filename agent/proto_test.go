package agent

import (
	"bytes"
	"encoding/json"
	"net"
	"testing"
	"time"
)

// nopConn is a net.Conn that discards writes and never yields data.
type nopConn struct{ net.Conn }

func (nopConn) Write(p []byte) (int, error)      { return len(p), nil }
func (nopConn) Close() error                     { return nil }
func (nopConn) SetWriteDeadline(time.Time) error { return nil }
func (nopConn) SetDeadline(time.Time) error      { return nil }

func TestFrameRoundTrip(t *testing.T) {
	var b []byte
	b = AppendFrame(b, FrameStdout, 7, []byte("hello"))
	b = AppendFrame(b, FrameEOF, 1<<31, nil)
	f, n, err := DecodeFrame(b)
	if err != nil || f.Type != FrameStdout || f.Stream != 7 || string(f.Payload) != "hello" || n != HeaderSize+5 {
		t.Fatalf("%+v %d %v", f, n, err)
	}
	f, n, err = DecodeFrame(b[n:])
	if err != nil || f.Type != FrameEOF || f.Stream != 1<<31 || len(f.Payload) != 0 || n != HeaderSize {
		t.Fatalf("%+v %d %v", f, n, err)
	}
	if _, _, err := DecodeFrame(b[:HeaderSize+4]); err != ErrShortFrame {
		t.Fatalf("short: %v", err)
	}
	big := []byte{byte(FrameData), 0, 0, 0, 1, 0, 0x10, 0, 1}
	if _, _, err := DecodeFrame(big); err == nil {
		t.Fatal("oversized frame accepted")
	}
	if _, err := ReadFrame(bytes.NewReader(big)); err == nil {
		t.Fatal("oversized frame read")
	}
	large := AppendFrame(nil, FrameData, 3, bytes.Repeat([]byte{7}, MaxFrameSize))
	f, err = ReadFrame(bytes.NewReader(large))
	if err != nil || len(f.Payload) != MaxFrameSize {
		t.Fatalf("max frame: %v", err)
	}
}

func TestRing(t *testing.T) {
	r := outRing{max: 1 << 12}
	var want [][]byte
	for i := range 200 {
		d := bytes.Repeat([]byte{byte(i)}, i%97+1)
		r.evictFor(len(d))
		r.append(kindStdout+byte(i%2), d)
		want = append(want, d)
		if r.used() > int64(r.max) || len(r.buf) > r.max {
			t.Fatalf("ring over max: used %d cap %d", r.used(), len(r.buf))
		}
	}
	// The retained records are the most recent ones, intact.
	var got [][]byte
	for off := r.head; off < r.tail; {
		k, n := r.record(off)
		d := make([]byte, n)
		r.copyOut(off+ringHeader, d)
		if k != kindStdout && k != kindStderr {
			t.Fatalf("bad kind %d", k)
		}
		got = append(got, d)
		off += int64(ringHeader + n)
	}
	want = want[len(want)-len(got):]
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("record %d differs", i)
		}
	}
}

// FuzzDecodeFrame feeds arbitrary bytes, as a hostile agent could send them,
// to the frame decoders and to the client's dispatch and reply decoders.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(AppendFrame(nil, FrameStarted, 1, []byte(`{"pid":3}`)))
	f.Add(append(AppendFrame(nil, FrameStdout, 1, []byte("out")), AppendFrame(nil, FrameExit, 1, []byte(`{"code":1,"signal":"SIGKILL"}`))...))
	f.Add(AppendFrame(nil, FrameItems, 2, []byte(`[{"name":"a","path":"/a","type":"file","size":1,"mode":420,"mtime":"2024-01-01T00:00:00Z"}]`)))
	f.Add(AppendFrame(nil, FrameError, 3, []byte(`{"code":"not_found","message":"x"}`)))
	f.Add(AppendFrame(nil, FrameWindow, 1, encodeWindow(100)))
	f.Add([]byte{0x61, 0, 0, 0, 1, 0, 0x10, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		c := &Client{conn: nopConn{}, cfg: Config{WriteTimeout: time.Second}, streams: map[uint32]*cstream{}, done: make(chan struct{})}
		var ss []*cstream
		for range 3 {
			s, err := c.open(FramePing, emptyMsg{})
			if err != nil {
				t.Fatal(err)
			}
			ss = append(ss, s)
		}
		r := bytes.NewReader(b)
		rest := b
		for {
			fr, n, err := DecodeFrame(rest)
			fr2, err2 := ReadFrame(r)
			if err != nil {
				if err2 == nil {
					t.Fatalf("DecodeFrame failed (%v) but ReadFrame did not", err)
				}
				break
			}
			if err2 != nil || fr2.Type != fr.Type || fr2.Stream != fr.Stream || !bytes.Equal(fr2.Payload, fr.Payload) {
				t.Fatalf("decoders disagree: %+v %v vs %+v", fr2, err2, fr)
			}
			if enc := AppendFrame(nil, fr.Type, fr.Stream, fr.Payload); !bytes.Equal(enc, rest[:n]) {
				t.Fatal("re-encoding differs")
			}
			rest = rest[n:]
			if err := c.dispatch(fr); err != nil {
				break // the client would close the connection
			}
		}
		for _, s := range ss {
			queued := 0
			for _, fr := range s.q {
				if fr.Type.credited() {
					queued += len(fr.Payload)
				}
				decodeReply(fr)
			}
			if queued > InitialWindow {
				t.Fatalf("stream %d queued %d credited bytes", s.id, queued)
			}
			if len(s.q) > maxControlFrames+InitialWindow {
				t.Fatalf("stream %d queued %d frames", s.id, len(s.q))
			}
		}
	})
}

// decodeReply runs every client-side decoder that could see the frame.
func decodeReply(f Frame) {
	switch f.Type {
	case FrameStarted:
		decodeJSON(f.Payload, &startedMsg{})
		decodeJSON(f.Payload, &ProcessInfo{})
	case FrameExit:
		decodeJSON(f.Payload, &exitMsg{})
	case FrameItems:
		var fis []FileInfo
		if decodeJSON(f.Payload, &fis) == nil {
			for _, fi := range fis {
				sanitizeInfo(fi)
			}
		}
		decodeJSON(f.Payload, &[]ProcessInfo{})
	default:
		for _, v := range []any{nil, &countMsg{}, &truncMsg{}, &FileInfo{}} {
			finalReply(f, v)
		}
	}
}

func TestErrorIs(t *testing.T) {
	e := error(&Error{Code: CodeNotFound, Message: "x"})
	if !json.Valid([]byte(`{}`)) || e.Error() != "agent: not_found: x" {
		t.Fatal(e)
	}
}
