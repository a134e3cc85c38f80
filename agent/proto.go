// Package agent is the in-sandbox agent (PID 1 of a sandbox) and its
// host-side client. The two talk over one connected stream socket using the
// multiplexed frame protocol described below.
//
// # Frames
//
// Every frame is a 9-byte header followed by a payload:
//
//	byte 0     frame type (FrameType)
//	bytes 1-4  stream id, big-endian uint32
//	bytes 5-8  payload length, big-endian uint32 (at most MaxFrameSize)
//
// Control payloads (requests, Started, Result, Error, Exit, Hello) are JSON
// objects decoded strictly (unknown fields and trailing data are errors).
// Stdout, Stderr, Data and Items payloads are raw bytes (Items carries a JSON
// array chunk). Window payloads are a 4-byte big-endian credit increment.
//
// # Streams
//
// Stream 0 carries only the hello exchange: the host sends Hello{version,
// home}, the agent answers Hello{version, pid} or Error. Every request opens a
// new stream whose id the host chooses (non-zero, increasing). The agent ends
// its side of a stream with exactly one final frame (Result, Error or Exit);
// either side may abandon a stream with Reset. Frames for a stream the
// receiver does not know (already finished or reset) are dropped.
//
// # Back-pressure
//
// Stdout, Stderr, Data and Items frames are flow-controlled per stream and per
// direction with credit, like HTTP/2: each side may send InitialWindow bytes
// of such payload on a new stream, and may send more only after the receiver
// grants it with Window frames as it consumes. A sender that exceeds its
// credit is in violation (the host closes the connection; the agent resets
// the stream). Control frames are not credited but are few and bounded per
// stream. Because neither side ever waits on the socket for one stream, a
// stream whose consumer stops reading stalls only itself.
//
// In the agent, a process's output is read continuously into a bounded ring
// buffer (RingSize) shared by every stream following that process. Followers
// are lossless: when the slowest attached follower is a full ring behind, the
// agent stops reading the process's pipes and the process blocks in write(2),
// exactly as with a slow pipe. With no follower attached the ring overwrites
// its oldest output, so a detached background process never blocks.
package agent

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	rt "github.com/airlock-dev/airlock/runtime"
)

// Version is the protocol version exchanged in the hello. Host and agent are
// the same binary, so only an exact match is accepted.
const Version = 1

// Protocol sizes.
const (
	// HeaderSize is the size of a frame header.
	HeaderSize = 9
	// MaxFrameSize bounds a frame's payload; larger frames are a protocol
	// violation.
	MaxFrameSize = 1 << 20
	// InitialWindow is each direction's credit on a new stream, in bytes of
	// Stdout, Stderr, Data or Items payload.
	InitialWindow = 256 << 10
	// RingSize bounds the recent output the agent keeps per process for
	// re-attaching (stdout and stderr together, with small record headers).
	RingSize = 1 << 20
	// MaxListEntries bounds the entries of one List and the processes of one
	// Processes reply; longer results are truncated.
	MaxListEntries = 100000
)

// chunkSize is the largest piece of output or file data the agent reads or
// sends at once.
const chunkSize = 32 << 10

// FrameType is the first byte of a frame header.
type FrameType uint8

// Frame types. Requests (host to agent) open a stream; 0x30-0x5f are reserved
// for future requests (interpreter contexts, egress bridge). A request type
// the agent does not know is answered with an Error of code "unsupported".
const (
	// FrameHello is the version handshake on stream 0, both directions.
	FrameHello FrameType = 0x01

	// FramePing asks for an empty Result.
	FramePing FrameType = 0x10
	// FrameExec starts a process; the stream then follows its output.
	FrameExec FrameType = 0x11
	// FrameAttach follows an existing process: buffered output, then live.
	FrameAttach FrameType = 0x12
	// FrameProcesses lists processes as Items, then a Result.
	FrameProcesses FrameType = 0x13
	// FrameStdin writes the stream's Data to a process's stdin.
	FrameStdin FrameType = 0x14
	// FrameSignal signals a process group.
	FrameSignal FrameType = 0x15
	// FrameReadFile streams a regular file back as Data.
	FrameReadFile FrameType = 0x20
	// FrameWriteFile writes the stream's Data to a regular file.
	FrameWriteFile FrameType = 0x21
	// FrameRemove removes a path recursively.
	FrameRemove FrameType = 0x22
	// FrameList lists a directory tree as Items, then a Result.
	FrameList FrameType = 0x23
	// FrameStat describes one path (without following a final symlink).
	FrameStat FrameType = 0x24
	// FrameMkdir creates a directory and its parents.
	FrameMkdir FrameType = 0x25
	// FrameMove renames a path.
	FrameMove FrameType = 0x26

	// FrameData carries raw bytes: stdin (host to agent) or file content.
	FrameData FrameType = 0x60
	// FrameStdout carries a process's standard output.
	FrameStdout FrameType = 0x61
	// FrameStderr carries a process's standard error.
	FrameStderr FrameType = 0x62
	// FrameItems carries a JSON array of list entries or processes.
	FrameItems FrameType = 0x63
	// FrameEOF ends the host's Data on a stream.
	FrameEOF FrameType = 0x64
	// FrameWindow grants the peer more credit on a stream.
	FrameWindow FrameType = 0x65
	// FrameReset abandons a stream.
	FrameReset FrameType = 0x66

	// FrameStarted is the agent's first reply to Exec, Attach and ReadFile.
	FrameStarted FrameType = 0x70
	// FrameResult ends a stream successfully.
	FrameResult FrameType = 0x71
	// FrameError ends a stream with an Error.
	FrameError FrameType = 0x72
	// FrameExit ends an Exec or Attach stream with the exit status.
	FrameExit FrameType = 0x73
)

var frameNames = map[FrameType]string{
	FrameHello: "hello", FramePing: "ping", FrameExec: "exec", FrameAttach: "attach",
	FrameProcesses: "processes", FrameStdin: "stdin", FrameSignal: "signal", FrameKillProcesses: "kill_processes",
	FrameReadFile: "read_file", FrameWriteFile: "write_file", FrameRemove: "remove",
	FrameList: "list", FrameStat: "stat", FrameMkdir: "mkdir", FrameMove: "move",
	FrameData: "data", FrameStdout: "stdout", FrameStderr: "stderr", FrameItems: "items",
	FrameEOF: "eof", FrameWindow: "window", FrameReset: "reset", FrameStarted: "started",
	FrameResult: "result", FrameError: "error", FrameExit: "exit",
}

// String names the frame type.
func (t FrameType) String() string {
	if n, ok := frameNames[t]; ok {
		return n
	}
	return fmt.Sprintf("frame(0x%02x)", uint8(t))
}

// credited reports whether the frame's payload counts against stream credit.
func (t FrameType) credited() bool {
	return t == FrameData || t == FrameStdout || t == FrameStderr || t == FrameItems
}

// final reports whether the frame ends the agent's side of a stream.
func (t FrameType) final() bool {
	return t == FrameResult || t == FrameError || t == FrameExit
}

// Frame is one decoded frame.
type Frame struct {
	Type    FrameType
	Stream  uint32
	Payload []byte
}

// Frame decoding errors.
var (
	// ErrFrameTooLarge reports a header announcing more than MaxFrameSize.
	ErrFrameTooLarge = errors.New("agent: frame larger than MaxFrameSize")
	// ErrShortFrame reports a buffer that ends inside a frame.
	ErrShortFrame = errors.New("agent: short frame")
)

// AppendFrame appends the encoding of a frame to dst. It panics if the
// payload exceeds MaxFrameSize, which is a programming error.
func AppendFrame(dst []byte, t FrameType, stream uint32, payload []byte) []byte {
	if len(payload) > MaxFrameSize {
		panic("agent: frame payload larger than MaxFrameSize")
	}
	var h [HeaderSize]byte
	putHeader(&h, t, stream, len(payload))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

func putHeader(h *[HeaderSize]byte, t FrameType, stream uint32, n int) {
	h[0] = byte(t)
	binary.BigEndian.PutUint32(h[1:5], stream)
	binary.BigEndian.PutUint32(h[5:9], uint32(n))
}

// parseHeader validates a header and returns its fields.
func parseHeader(h []byte) (FrameType, uint32, int, error) {
	n := binary.BigEndian.Uint32(h[5:9])
	if n > MaxFrameSize {
		return 0, 0, 0, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	return FrameType(h[0]), binary.BigEndian.Uint32(h[1:5]), int(n), nil
}

// DecodeFrame decodes the first frame in b and returns it with the number of
// bytes it used. The payload aliases b. A b that ends inside the frame gives
// ErrShortFrame.
func DecodeFrame(b []byte) (Frame, int, error) {
	if len(b) < HeaderSize {
		return Frame{}, 0, ErrShortFrame
	}
	t, id, n, err := parseHeader(b[:HeaderSize])
	if err != nil {
		return Frame{}, 0, err
	}
	if len(b)-HeaderSize < n {
		return Frame{}, 0, ErrShortFrame
	}
	return Frame{Type: t, Stream: id, Payload: b[HeaderSize : HeaderSize+n : HeaderSize+n]}, HeaderSize + n, nil
}

// ReadFrame reads one frame from r into a newly allocated payload. It never
// allocates more than MaxFrameSize, and only as the bytes arrive in pieces of
// at most 64 KiB, so a peer announcing a large frame and then stalling does
// not pin a large buffer.
func ReadFrame(r io.Reader) (Frame, error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	t, id, n, err := parseHeader(h[:])
	if err != nil {
		return Frame{}, err
	}
	f := Frame{Type: t, Stream: id}
	if n == 0 {
		return f, nil
	}
	const step = 64 << 10
	if n <= step {
		f.Payload = make([]byte, n)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			return Frame{}, fmt.Errorf("reading %s frame payload: %w", t, noEOF(err))
		}
		return f, nil
	}
	var buf bytes.Buffer
	if _, err := io.CopyN(&buf, r, int64(n)); err != nil {
		return Frame{}, fmt.Errorf("reading %s frame payload: %w", t, noEOF(err))
	}
	f.Payload = buf.Bytes()
	return f, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// encodeWindow is the payload of a Window frame.
func encodeWindow(n uint32) []byte {
	return binary.BigEndian.AppendUint32(make([]byte, 0, 4), n)
}

func decodeWindow(p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("window frame has %d payload bytes, want 4", len(p))
	}
	n := binary.BigEndian.Uint32(p)
	if n == 0 || n > MaxFrameSize*64 {
		return 0, fmt.Errorf("window increment %d out of range", n)
	}
	return n, nil
}

// decodeJSON decodes exactly one JSON value into v, rejecting unknown fields
// and trailing data.
func decodeJSON(p []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding %T: %w", v, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("decoding %T: trailing data after JSON value", v)
	}
	return nil
}

// Wire messages. They are the JSON payloads of control frames.

type helloMsg struct {
	Version int    `json:"version"`
	Home    string `json:"home,omitempty"`
	Pid     int    `json:"pid,omitempty"`
	// SpawnerTid is the agent's thread that forks workload processes.
	SpawnerTid int `json:"spawner_tid,omitempty"`
	// Layers is what an agent serving on the network (MainListen) observed
	// of its own confinement; empty from an agent the host started.
	Layers []rt.Layer `json:"layers,omitempty"`
}

type execMsg struct {
	Argv        []string `json:"argv,omitempty"`
	Shell       string   `json:"shell,omitempty"`
	Cwd         string   `json:"cwd,omitempty"`
	Env         []string `json:"env,omitempty"`
	Tag         string   `json:"tag,omitempty"`
	Background  bool     `json:"background,omitempty"`
	StdinStream bool     `json:"stdin_stream,omitempty"` // Data frames and EOF follow
	StdinOpen   bool     `json:"stdin_open,omitempty"`   // keep stdin open after EOF
	Pty         *PtySize `json:"pty,omitempty"`
}

type pidMsg struct {
	Pid int `json:"pid"`
	// Snapshot (attach) sends the output retained so far, then an exit
	// frame (Running if the process has not exited) instead of following.
	Snapshot bool `json:"snapshot,omitempty"`
}

type stdinMsg struct {
	Pid   int  `json:"pid"`
	Close bool `json:"close,omitempty"`
}

type signalMsg struct {
	Pid    int `json:"pid"`
	Signal int `json:"signal"`
}

type pathMsg struct {
	Path string `json:"path"`
}

type writeFileMsg struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode,omitempty"`
	// SetMetadata makes Metadata the file's whole metadata (E2B's
	// uploads); without it the metadata is left as it was.
	SetMetadata bool              `json:"set_metadata,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
}

type listMsg struct {
	Path  string `json:"path"`
	Depth int    `json:"depth,omitempty"`
}

type moveMsg struct {
	From string `json:"from"`
	To   string `json:"to"`
}

type startedMsg struct {
	Pid  int   `json:"pid,omitempty"`
	Size int64 `json:"size,omitempty"`
}

type exitMsg struct {
	Code   int    `json:"code"`
	Signal string `json:"signal,omitempty"`
	// Running ends a snapshot of a process that has not exited.
	Running bool `json:"running,omitempty"`
}

// pongMsg answers a ping.
type pongMsg struct {
	// OOMKills is how many workload processes the agent has killed for
	// memory (the gvisor runtime's workload cgroup; 0 elsewhere).
	OOMKills int64 `json:"oom_kills,omitempty"`
}

type countMsg struct {
	Bytes int64 `json:"bytes"`
}

type truncMsg struct {
	Truncated bool `json:"truncated,omitempty"`
}

type emptyMsg struct{}
