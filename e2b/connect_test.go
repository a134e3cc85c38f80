package e2b

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func envelope(flags byte, payload string) []byte {
	return AppendEnvelope(nil, flags, []byte(payload))
}

func TestReadEnvelopeRoundTrip(t *testing.T) {
	var b []byte
	b = AppendEnvelope(b, 0, []byte(`{"a":1}`))
	b = AppendEnvelope(b, 0, nil)
	b = AppendEnvelope(b, flagEndStream, []byte(`{}`))
	r := bytes.NewReader(b)
	for i, want := range []struct {
		flags   byte
		payload string
	}{{0, `{"a":1}`}, {0, ``}, {flagEndStream, `{}`}} {
		flags, p, err := ReadEnvelope(r, 1024)
		if err != nil || flags != want.flags || string(p) != want.payload {
			t.Fatalf("envelope %d: flags %d payload %q err %v", i, flags, p, err)
		}
	}
	if _, _, err := ReadEnvelope(r, 1024); err != io.EOF {
		t.Fatalf("after the last envelope: %v, want io.EOF", err)
	}
}

func TestReadEnvelopeHostile(t *testing.T) {
	huge := make([]byte, 5)
	binary.BigEndian.PutUint32(huge[1:], 0xFFFFFFFF)
	for _, tc := range []struct {
		name string
		in   []byte
		max  int
		want error
	}{
		{"empty", nil, 16, io.EOF},
		{"one byte of header", []byte{0}, 16, ErrTruncatedEnvelope},
		{"four bytes of header", []byte{0, 0, 0, 0}, 16, ErrTruncatedEnvelope},
		{"payload cut short", envelope(0, "0123456789")[:10], 16, ErrTruncatedEnvelope},
		{"header only, payload announced", []byte{0, 0, 0, 0, 3}, 16, ErrTruncatedEnvelope},
		{"length 4 GiB", append(huge, 'x', 'y', 'z'), 1 << 20, ErrEnvelopeTooLarge},
		{"one over the limit", envelope(0, "0123456789abcdefg"), 16, ErrEnvelopeTooLarge},
		{"negative limit", envelope(0, ""), -1, ErrEnvelopeTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := bytes.NewReader(tc.in)
			_, p, err := ReadEnvelope(r, tc.max)
			if !errors.Is(err, tc.want) && err != tc.want {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if p != nil {
				t.Fatalf("payload %q returned with an error", p)
			}
			if errors.Is(tc.want, ErrEnvelopeTooLarge) && len(tc.in) > 5 && r.Len() != len(tc.in)-5 {
				t.Fatalf("an oversized envelope's payload was read: %d bytes left of %d", r.Len(), len(tc.in)-5)
			}
		})
	}
}

func TestReadEnvelopeLimitIsInclusive(t *testing.T) {
	_, p, err := ReadEnvelope(bytes.NewReader(envelope(0, "0123456789abcdef")), 16)
	if err != nil || len(p) != 16 {
		t.Fatalf("16 bytes with limit 16: %q %v", p, err)
	}
}

// errReader fails after its data.
type errReader struct {
	data []byte
	err  error
}

func (e *errReader) Read(p []byte) (int, error) {
	if len(e.data) == 0 {
		return 0, e.err
	}
	n := copy(p, e.data)
	e.data = e.data[n:]
	return n, nil
}

func TestReadEnvelopePassesReadErrors(t *testing.T) {
	boom := errors.New("boom")
	if _, _, err := ReadEnvelope(&errReader{err: boom}, 16); !errors.Is(err, boom) {
		t.Fatalf("header: %v", err)
	}
	if _, _, err := ReadEnvelope(&errReader{data: []byte{0, 0, 0, 0, 4, 'a'}, err: boom}, 16); !errors.Is(err, boom) {
		t.Fatalf("payload: %v", err)
	}
}

// readStream parses a Connect streaming response: its messages and its
// end-of-stream message.
func readStream(t *testing.T, body []byte) ([]string, endStreamMessage) {
	t.Helper()
	r := bytes.NewReader(body)
	var msgs []string
	for {
		flags, p, err := ReadEnvelope(r, 1<<20)
		if err != nil {
			t.Fatalf("response ends without an end-stream envelope: %v (body %q)", err, body)
		}
		if flags&flagEndStream != 0 {
			var end endStreamMessage
			if err := json.Unmarshal(p, &end); err != nil {
				t.Fatalf("end-stream payload %q: %v", p, err)
			}
			if r.Len() != 0 {
				t.Fatalf("%d bytes after the end-stream envelope", r.Len())
			}
			return msgs, end
		}
		msgs = append(msgs, string(p))
	}
}

func streamRequest(body []byte, hdr map[string]string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/process.Process/Start", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/connect+json")
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	return r
}

func echoStream(ctx context.Context, c *rpcCall, req []byte, send func(any) error) error {
	var m map[string]any
	if err := decodeMessage(req, &m); err != nil {
		return err
	}
	if err := send(m); err != nil {
		return err
	}
	return send(map[string]int{"n": 2})
}

func TestServeStream(t *testing.T) {
	w := httptest.NewRecorder()
	serveStream(w, streamRequest(envelope(0, `{"x":"y"}`), nil), echoStream)
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/connect+json" {
		t.Fatalf("status %d type %q", w.Code, w.Header().Get("Content-Type"))
	}
	msgs, end := readStream(t, w.Body.Bytes())
	if strings.Join(msgs, "|") != `{"x":"y"}|{"n":2}` || end.Error != nil {
		t.Fatalf("messages %q end %+v", msgs, end)
	}
}

func TestServeStreamHostileRequests(t *testing.T) {
	huge := []byte{0, 0xFF, 0xFF, 0xFF, 0xFF}
	big := make([]byte, 5)
	binary.BigEndian.PutUint32(big[1:], maxRequestBytes+1)
	for _, tc := range []struct {
		name string
		body []byte
		hdr  map[string]string
		want Code
	}{
		{"no request message", nil, nil, CodeInvalidArgument},
		{"truncated header", []byte{0, 0}, nil, CodeInvalidArgument},
		{"truncated payload", envelope(0, `{"x":1}`)[:8], nil, CodeInvalidArgument},
		{"length 4 GiB", huge, nil, CodeResourceExhausted},
		{"one over the request limit", big, nil, CodeResourceExhausted},
		{"compressed without encoding", envelope(flagCompressed, `{}`), nil, CodeInternal},
		{"end-stream flag from the client", envelope(flagEndStream, `{}`), nil, CodeInvalidArgument},
		{"unknown flag bits", envelope(0x80, `{}`), nil, CodeInvalidArgument},
		{"two request messages", append(envelope(0, `{}`), envelope(0, `{}`)...), nil, CodeInvalidArgument},
		{"trailing garbage", append(envelope(0, `{}`), 'x'), nil, CodeInvalidArgument},
		{"not JSON", envelope(0, `{"x":`), nil, CodeInvalidArgument},
		{"two JSON values", envelope(0, `{} {}`), nil, CodeInvalidArgument},
		{"stream compression", envelope(0, `{}`), map[string]string{"Connect-Content-Encoding": "gzip"}, CodeUnimplemented},
		{"bad timeout", envelope(0, `{}`), map[string]string{"Connect-Timeout-Ms": "-5"}, CodeInvalidArgument},
		{"timeout too long", envelope(0, `{}`), map[string]string{"Connect-Timeout-Ms": "12345678901"}, CodeInvalidArgument},
		{"protocol version 2", envelope(0, `{}`), map[string]string{"Connect-Protocol-Version": "2"}, CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			called := false
			serveStream(w, streamRequest(tc.body, tc.hdr), func(ctx context.Context, c *rpcCall, req []byte, send func(any) error) error {
				called = true
				return echoStream(ctx, c, req, send)
			})
			if w.Code != 200 {
				t.Fatalf("status %d: stream errors travel in the end-stream message", w.Code)
			}
			msgs, end := readStream(t, w.Body.Bytes())
			if end.Error == nil || end.Error.Code != tc.want || len(msgs) != 0 {
				t.Fatalf("messages %q end %+v, want code %s", msgs, end.Error, tc.want)
			}
			if called && tc.want != CodeInvalidArgument {
				t.Fatalf("handler ran for a rejected request")
			}
		})
	}
}

func TestServeStreamMediaTypes(t *testing.T) {
	for _, ct := range []string{"application/connect+proto", "application/json", "text/plain", "application/connect+json; charset=latin1"} {
		r := streamRequest(envelope(0, `{}`), nil)
		r.Header.Set("Content-Type", ct)
		w := httptest.NewRecorder()
		serveStream(w, r, echoStream)
		if w.Code != http.StatusUnsupportedMediaType {
			t.Errorf("%q: status %d, want 415", ct, w.Code)
		}
	}
	r := streamRequest(envelope(0, `{}`), nil)
	r.Header.Set("Content-Type", "application/connect+json; charset=utf-8")
	w := httptest.NewRecorder()
	serveStream(w, r, echoStream)
	if _, end := readStream(t, w.Body.Bytes()); end.Error != nil {
		t.Fatalf("charset=utf-8: %+v", end.Error)
	}
}

func TestServeStreamTimeout(t *testing.T) {
	w := httptest.NewRecorder()
	r := streamRequest(envelope(0, `{}`), map[string]string{"Connect-Timeout-Ms": "20"})
	var got time.Duration
	serveStream(w, r, func(ctx context.Context, c *rpcCall, req []byte, send func(any) error) error {
		got = c.timeout
		<-ctx.Done()
		return ctx.Err()
	})
	_, end := readStream(t, w.Body.Bytes())
	if got != 20*time.Millisecond || end.Error == nil || end.Error.Code != CodeDeadlineExceeded {
		t.Fatalf("timeout %v, end %+v", got, end.Error)
	}
}

func TestServeStreamHandlerError(t *testing.T) {
	w := httptest.NewRecorder()
	serveStream(w, streamRequest(envelope(0, `{}`), nil), func(ctx context.Context, c *rpcCall, req []byte, send func(any) error) error {
		if err := send(map[string]int{"a": 1}); err != nil {
			return err
		}
		return errorf(CodeNotFound, "no such process")
	})
	msgs, end := readStream(t, w.Body.Bytes())
	if len(msgs) != 1 || end.Error == nil || end.Error.Code != CodeNotFound || end.Error.Message != "no such process" {
		t.Fatalf("messages %q end %+v", msgs, end.Error)
	}
}

func unaryRequest(body []byte, ct string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/filesystem.Filesystem/Stat", bytes.NewReader(body))
	r.Header.Set("Content-Type", ct)
	return r
}

func echoUnary(ctx context.Context, c *rpcCall, req []byte) (any, error) {
	var m pathRequest
	if err := decodeMessage(req, &m); err != nil {
		return nil, err
	}
	if m.Path == "missing" {
		return nil, errorf(CodeNotFound, "not there")
	}
	return &m, nil
}

func TestServeUnary(t *testing.T) {
	for _, tc := range []struct {
		name, body, ct string
		status         int
		code           Code
		resp           string
	}{
		{"ok", `{"path":"/a"}`, "application/json", 200, "", `{"path":"/a"}`},
		{"charset", `{"path":"/a"}`, "application/json; charset=utf-8", 200, "", `{"path":"/a"}`},
		{"empty body is the empty message", ``, "application/json", 200, "", `{"path":""}`},
		{"unknown fields ignored", `{"path":"/a","future":[1,2]}`, "application/json", 200, "", `{"path":"/a"}`},
		{"handler error", `{"path":"missing"}`, "application/json", 404, CodeNotFound, ""},
		{"malformed JSON", `{"path":`, "application/json", 400, CodeInvalidArgument, ""},
		{"wrong type", `{"path":5}`, "application/json", 400, CodeInvalidArgument, ""},
		{"trailing data", `{"path":"/a"}x`, "application/json", 400, CodeInvalidArgument, ""},
		{"binary codec", "\x0a\x02/a", "application/proto", 415, "", ""},
		{"streaming type on a unary method", `{}`, "application/connect+json", 415, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			serveUnary(w, unaryRequest([]byte(tc.body), tc.ct), echoUnary)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d (body %q)", w.Code, tc.status, w.Body.String())
			}
			switch {
			case tc.code != "":
				var e Error
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code != tc.code {
					t.Fatalf("error body %q: %v", w.Body.String(), err)
				}
				if w.Header().Get("Content-Type") != "application/json" {
					t.Fatalf("error content type %q", w.Header().Get("Content-Type"))
				}
			case tc.resp != "":
				if strings.TrimSpace(w.Body.String()) != tc.resp {
					t.Fatalf("body %q, want %q", w.Body.String(), tc.resp)
				}
			}
		})
	}
}

func TestServeUnaryOversizedBody(t *testing.T) {
	body := bytes.Repeat([]byte(" "), maxRequestBytes+1)
	w := httptest.NewRecorder()
	called := false
	serveUnary(w, unaryRequest(body, "application/json"), func(ctx context.Context, c *rpcCall, req []byte) (any, error) {
		called = true
		return &empty{}, nil
	})
	if w.Code != http.StatusTooManyRequests || called {
		t.Fatalf("status %d called %v, want 429 (resource_exhausted) without calling the handler", w.Code, called)
	}
}

func TestServeUnaryMethodAndEncoding(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/filesystem.Filesystem/Stat", nil)
	w := httptest.NewRecorder()
	serveUnary(w, r, echoUnary)
	if w.Code != http.StatusNotImplemented {
		t.Fatalf("GET: status %d", w.Code)
	}
	r = unaryRequest([]byte(`{}`), "application/json")
	r.Header.Set("Content-Encoding", "gzip")
	w = httptest.NewRecorder()
	serveUnary(w, r, echoUnary)
	if w.Code != http.StatusNotImplemented {
		t.Fatalf("gzip: status %d", w.Code)
	}
}

func TestCodeHTTPStatus(t *testing.T) {
	// The Connect protocol's table, and what the E2B SDK's client maps back.
	for c, want := range map[Code]int{CodeCanceled: 499, CodeUnknown: 500, CodeInvalidArgument: 400,
		CodeDeadlineExceeded: 504, CodeNotFound: 404, CodeAlreadyExists: 409, CodePermissionDenied: 403,
		CodeResourceExhausted: 429, CodeFailedPrecondition: 400, CodeAborted: 409, CodeOutOfRange: 400,
		CodeUnimplemented: 501, CodeInternal: 500, CodeUnavailable: 503, CodeDataLoss: 500, CodeUnauthenticated: 401} {
		if got := c.HTTPStatus(); got != want {
			t.Errorf("%s: %d, want %d", c, got, want)
		}
	}
}

// FuzzReadStreamRequest feeds arbitrary bodies to the stream request
// reader: it must never panic, allocate beyond its limit, or accept a body
// that is not exactly one well-formed, uncompressed envelope.
func FuzzReadStreamRequest(f *testing.F) {
	f.Add(envelope(0, `{"process":{"cmd":"ls"}}`))
	f.Add([]byte{0, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Add(append(envelope(0, `{}`), envelope(2, `{}`)...))
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := readStreamRequest(bytes.NewReader(body))
		if err != nil {
			return
		}
		if len(body) < envelopeHeader || body[0] != 0 {
			t.Fatalf("accepted %q", body)
		}
		n := binary.BigEndian.Uint32(body[1:5])
		if int(n) != len(body)-envelopeHeader || len(p) > maxRequestBytes {
			t.Fatalf("accepted %q with announced length %d", body, n)
		}
	})
}
