package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	rt "github.com/airlock-dev/airlock/runtime"
)

// Client errors.
var (
	// ErrClosed reports that the connection to the agent is closed; errors
	// from a lost connection wrap it.
	ErrClosed = errors.New("agent: connection closed")
	// ErrProtocol reports that the agent broke the protocol; errors about
	// malformed or unexpected replies wrap it.
	ErrProtocol = errors.New("agent: protocol violation")
	// ErrDetached is returned by Process methods after Close.
	ErrDetached = errors.New("agent: process detached")
)

// Limits the client applies to what the agent sends.
const (
	maxControlFrames = 4        // uncredited frames per stream
	maxErrorMessage  = 4096     // bytes of an Error message kept
	maxErrorCode     = 64       // bytes of an Error code kept
	sendChunk        = 64 << 10 // largest Data frame the client sends
	maxCredit        = 1 << 40  // cap on accumulated send credit
	defaultHome      = "/workspace"
)

// Config tunes a Client. The zero value is usable.
type Config struct {
	// Home is the agent's directory for relative paths and the default
	// working directory; "/workspace" if empty.
	Home string
	// HelloTimeout bounds the handshake; 10 seconds if zero.
	HelloTimeout time.Duration
	// WriteTimeout bounds one frame write; an agent that stops reading
	// for longer is considered dead and the connection is closed. 30
	// seconds if zero.
	WriteTimeout time.Duration
}

// Client talks to one agent over one connection. It is safe for concurrent
// use. Everything the agent sends is treated as hostile: frame sizes, credit
// and the number of control frames are enforced and JSON is decoded strictly;
// a violation closes the connection or fails the request with ErrProtocol.
type Client struct {
	conn       net.Conn
	cfg        Config
	agentPid   int
	spawnerTid int
	layers     []rt.Layer

	wmu  sync.Mutex
	wbuf []byte

	mu      sync.Mutex
	streams map[uint32]*cstream
	nextID  uint32
	err     error
	done    chan struct{}
}

// NewClient performs the hello on conn and returns a client using the default
// Config. The client owns conn.
func NewClient(conn net.Conn) (*Client, error) {
	return NewClientConfig(conn, Config{})
}

// NewClientConfig is NewClient with a Config.
func NewClientConfig(conn net.Conn, cfg Config) (*Client, error) {
	if cfg.Home == "" {
		cfg.Home = defaultHome
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = 10 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	c := &Client{conn: conn, cfg: cfg, streams: make(map[uint32]*cstream), done: make(chan struct{})}
	br := bufio.NewReaderSize(conn, 8192)
	if err := c.hello(br); err != nil {
		conn.Close()
		return nil, fmt.Errorf("agent hello: %w", err)
	}
	go c.readLoop(br)
	return c, nil
}

// ContinueClient returns a client for an agent whose session goes on over
// conn without a new hello: an agent restored from a checkpoint after the
// host process that spoke to it is gone (a paused gvisor sandbox after a
// server restart). The agent may still hold streams of the old session:
// the new client's stream ids start at 1<<31, above any of those. The
// agent's pids are unknown (0). The client owns conn.
func ContinueClient(conn net.Conn, cfg Config) *Client {
	if cfg.Home == "" {
		cfg.Home = defaultHome
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	c := &Client{conn: conn, cfg: cfg, streams: make(map[uint32]*cstream), nextID: 1 << 31, done: make(chan struct{})}
	go c.readLoop(bufio.NewReaderSize(conn, 8192))
	return c
}

func (c *Client) hello(br *bufio.Reader) error {
	c.conn.SetDeadline(time.Now().Add(c.cfg.HelloTimeout))
	defer c.conn.SetDeadline(time.Time{})
	p, err := json.Marshal(helloMsg{Version: Version, Home: c.cfg.Home})
	if err != nil {
		return fmt.Errorf("encoding hello: %w", err)
	}
	if _, err := c.conn.Write(AppendFrame(nil, FrameHello, 0, p)); err != nil {
		return fmt.Errorf("sending hello: %w", err)
	}
	f, err := ReadFrame(br)
	if err != nil {
		return fmt.Errorf("reading hello: %w", err)
	}
	if f.Stream != 0 {
		return fmt.Errorf("%w: hello reply on stream %d", ErrProtocol, f.Stream)
	}
	switch f.Type {
	case FrameError:
		return decodeError(f.Payload)
	case FrameHello:
	default:
		return fmt.Errorf("%w: %s frame instead of hello", ErrProtocol, f.Type)
	}
	var h helloMsg
	if err := decodeJSON(f.Payload, &h); err != nil {
		return fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	if h.Version != Version {
		return fmt.Errorf("agent speaks protocol version %d, host %d", h.Version, Version)
	}
	c.agentPid, c.spawnerTid, c.layers = h.Pid, h.SpawnerTid, h.Layers
	return nil
}

// AgentLayers returns what an agent serving on the network reported of its
// own confinement in the hello (identity, capabilities, no_new_privs,
// seccomp), or nil for an agent the host started. It is the sandbox's own
// account, for display: a host must not trust it as enforcement.
func (c *Client) AgentLayers() []rt.Layer { return c.layers }

// AgentPid is the agent's pid in its own pid namespace, as it reported it.
func (c *Client) AgentPid() int { return c.agentPid }

// SpawnerTid is the id (in the sandbox's pid namespace) of the agent's
// thread that forks workload processes, as it reported it; 0 if none.
func (c *Client) SpawnerTid() int { return c.spawnerTid }

// Done is closed when the connection is closed or lost.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended, or nil while it is up.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection. The agent then kills every process and exits.
func (c *Client) Close() error {
	c.fail(ErrClosed)
	return nil
}

// fail ends the connection and every stream with err.
func (c *Client) fail(err error) {
	if !errors.Is(err, ErrClosed) {
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	streams := c.streams
	c.streams = map[uint32]*cstream{}
	close(c.done)
	c.mu.Unlock()
	c.conn.Close()
	for _, s := range streams {
		s.setErr(err)
	}
}

func (c *Client) readLoop(br *bufio.Reader) {
	for {
		f, err := ReadFrame(br)
		if err == nil {
			err = c.dispatch(f)
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
}

// dispatch routes one frame from the agent. It never blocks: what it queues
// is bounded by credit and by maxControlFrames.
func (c *Client) dispatch(f Frame) error {
	switch f.Type {
	case FrameStdout, FrameStderr, FrameData, FrameItems, FrameStarted,
		FrameResult, FrameError, FrameExit, FrameReset, FrameWindow:
	default:
		return fmt.Errorf("%w: unexpected %s frame", ErrProtocol, f.Type)
	}
	if f.Stream == 0 {
		return fmt.Errorf("%w: %s frame on stream 0", ErrProtocol, f.Type)
	}
	c.mu.Lock()
	s := c.streams[f.Stream]
	if s != nil && (f.Type.final() || f.Type == FrameReset) {
		delete(c.streams, f.Stream)
	}
	c.mu.Unlock()
	if s == nil {
		return nil // finished or reset by us: late frames are expected
	}
	return s.deliver(f)
}

// write sends one frame.
func (c *Client) write(t FrameType, id uint32, payload []byte) error {
	c.wmu.Lock()
	select {
	case <-c.done:
		c.wmu.Unlock()
		return c.Err()
	default:
	}
	c.conn.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
	var err error
	if len(payload) <= 4096 {
		c.wbuf = AppendFrame(c.wbuf[:0], t, id, payload)
		_, err = c.conn.Write(c.wbuf)
	} else {
		var h [HeaderSize]byte
		putHeader(&h, t, id, len(payload))
		bufs := net.Buffers{h[:], payload}
		_, err = bufs.WriteTo(c.conn)
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("writing %s frame: %w", t, err))
		return c.Err()
	}
	return nil
}

// openStarted opens a stream of type t for what ("dial", "watch") and waits
// for the agent's FrameStarted; on an error reply or anything else the
// stream is reset.
func (c *Client) openStarted(ctx context.Context, t FrameType, req any, what string) (*cstream, error) {
	s, err := c.open(t, req)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", what, err)
	}
	f, err := s.next(ctx)
	if err != nil {
		s.reset()
		return nil, err
	}
	switch f.Type {
	case FrameStarted:
		return s, nil
	case FrameError:
		s.reset()
		return nil, decodeError(f.Payload)
	default:
		s.reset()
		return nil, protoErr("unexpected %s frame starting a %s", f.Type, what)
	}
}

// open starts a request stream.
func (c *Client) open(t FrameType, req any) (*cstream, error) {
	payload, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding %s request: %w", t, err)
	}
	if len(payload) > MaxFrameSize {
		return nil, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("%s request is %d bytes, over %d", t, len(payload), MaxFrameSize)}
	}
	s := &cstream{c: c, credit: InitialWindow, recvLeft: InitialWindow,
		wake: make(chan struct{}, 1), creditWake: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	for {
		c.nextID++
		if c.nextID != 0 && c.streams[c.nextID] == nil {
			break
		}
	}
	s.id = c.nextID
	c.streams[s.id] = s
	c.mu.Unlock()
	if err := c.write(t, s.id, payload); err != nil {
		return nil, err
	}
	return s, nil
}

// cstream is the client's side of one stream.
type cstream struct {
	c  *Client
	id uint32

	mu         sync.Mutex
	q          []Frame
	wake       chan struct{}
	creditWake chan struct{}
	recvLeft   int64 // credited payload the agent may still send
	unacked    int64 // consumed but not yet granted back
	credit     int64 // credited payload we may still send
	controls   int
	final      bool  // the agent ended the stream (or we reset it)
	err        error // connection lost or stream reset by us
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// deliver queues a frame from the agent, enforcing credit and control-frame
// limits.
func (s *cstream) deliver(f Frame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case f.Type == FrameWindow:
		n, err := decodeWindow(f.Payload)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		if s.credit += int64(n); s.credit > maxCredit {
			s.credit = maxCredit
		}
		notify(s.creditWake)
		return nil
	case f.Type.credited():
		if int64(len(f.Payload)) > s.recvLeft {
			return fmt.Errorf("%w: %d bytes of %s beyond the granted credit on stream %d", ErrProtocol, len(f.Payload), f.Type, s.id)
		}
		s.recvLeft -= int64(len(f.Payload))
	default:
		if s.controls++; s.controls > maxControlFrames {
			return fmt.Errorf("%w: too many control frames on stream %d", ErrProtocol, s.id)
		}
	}
	if s.final {
		return nil
	}
	if f.Type.final() || f.Type == FrameReset {
		s.final = true
		notify(s.creditWake)
	}
	s.q = append(s.q, f)
	notify(s.wake)
	return nil
}

func (s *cstream) setErr(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	notify(s.wake)
	notify(s.creditWake)
}

// next returns the next frame from the agent.
func (s *cstream) next(ctx context.Context) (Frame, error) {
	for {
		s.mu.Lock()
		if len(s.q) > 0 {
			f := s.q[0]
			s.q[0] = Frame{}
			s.q = s.q[1:]
			s.mu.Unlock()
			return f, nil
		}
		err := s.err
		s.mu.Unlock()
		if err != nil {
			return Frame{}, err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return Frame{}, ctx.Err()
		}
	}
}

// consumed grants credit back for n bytes of processed payload.
func (s *cstream) consumed(n int) {
	s.mu.Lock()
	s.unacked += int64(n)
	var g int64
	if s.unacked >= InitialWindow/4 && !s.final && s.err == nil {
		g, s.unacked = s.unacked, 0
		s.recvLeft += g
	}
	s.mu.Unlock()
	if g > 0 {
		s.c.write(FrameWindow, s.id, encodeWindow(uint32(g)))
	}
}

// errEnded tells a sender that the agent has ended the stream; the final
// frame, read with next, says why.
var errEnded = errors.New("stream ended by agent")

// sendData sends p as Data frames within credit.
func (s *cstream) sendData(ctx context.Context, p []byte) error {
	for len(p) > 0 {
		s.mu.Lock()
		for s.credit <= 0 && !s.final && s.err == nil {
			s.mu.Unlock()
			select {
			case <-s.creditWake:
			case <-ctx.Done():
				return ctx.Err()
			}
			s.mu.Lock()
		}
		if s.err != nil || s.final {
			err := s.err
			s.mu.Unlock()
			if err == nil {
				err = errEnded
			}
			return err
		}
		n := int64(len(p))
		n = min(n, s.credit, sendChunk)
		s.credit -= n
		s.mu.Unlock()
		if err := s.c.write(FrameData, s.id, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// reset abandons the stream.
func (s *cstream) reset() {
	c := s.c
	c.mu.Lock()
	present := c.streams[s.id] == s
	if present {
		delete(c.streams, s.id)
	}
	c.mu.Unlock()
	if present {
		c.write(FrameReset, s.id, nil)
	}
	s.mu.Lock()
	s.final = true
	if s.err == nil {
		s.err = ErrDetached
	}
	s.mu.Unlock()
	notify(s.wake)
	notify(s.creditWake)
}

// protoErr builds an ErrProtocol error.
func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)
}

// decodeError decodes an Error payload from the agent, bounding its fields.
func decodeError(p []byte) error {
	var e Error
	if err := decodeJSON(p, &e); err != nil {
		return protoErr("bad error reply: %v", err)
	}
	if e.Code == "" {
		e.Code = CodeInternal
	}
	if len(e.Code) > maxErrorCode {
		e.Code = e.Code[:maxErrorCode]
	}
	if len(e.Message) > maxErrorMessage {
		e.Message = e.Message[:maxErrorMessage] + "..."
	}
	return &e
}

// finalReply interprets a frame expected to end the stream with a Result
// decoded into result (which may be nil for an empty result).
func finalReply(f Frame, result any) error {
	switch f.Type {
	case FrameResult:
		if result == nil {
			result = &emptyMsg{}
		}
		if err := decodeJSON(f.Payload, result); err != nil {
			return protoErr("bad result: %v", err)
		}
		return nil
	case FrameError:
		return decodeError(f.Payload)
	case FrameReset:
		return protoErr("stream reset by agent")
	}
	return protoErr("unexpected %s frame", f.Type)
}

// call runs a request whose only reply is a Result or an Error.
func (c *Client) call(ctx context.Context, t FrameType, req, result any) error {
	s, err := c.open(t, req)
	if err != nil {
		return fmt.Errorf("agent %s: %w", t, err)
	}
	f, err := s.next(ctx)
	if err != nil {
		s.reset()
		return fmt.Errorf("agent %s: %w", t, err)
	}
	if err := finalReply(f, result); err != nil {
		s.reset()
		return err
	}
	return nil
}

// Ping checks that the agent answers.
func (c *Client) Ping(ctx context.Context) error {
	return c.call(ctx, FramePing, emptyMsg{}, &pongMsg{})
}

// OOMKills asks the agent how many workload processes it has killed for
// memory: under gVisor, whose sentry does not enforce memory limits, the
// agent does (0 under other runtimes, where the kernel's OOM killer does
// and the host counts).
func (c *Client) OOMKills(ctx context.Context) (int64, error) {
	var p pongMsg
	if err := c.call(ctx, FramePing, emptyMsg{}, &p); err != nil {
		return 0, err
	}
	return p.OOMKills, nil
}

// Process is a process being followed: started by Exec or attached to by
// Attach. Its output and exit arrive as Events; Wait and Collect consume the
// same events, so use one of Events, Wait and Collect. The consumer must keep
// reading (or Close the Process): a follower that stops reading eventually
// makes the process block on its output pipe.
//
// Events starts a goroutine (the pump) that turns the stream's frames into
// events. Wait and Collect called before any Events read the frames in the
// caller's goroutine instead: an exec that is only collected (most of them)
// costs no goroutine and no hand-off per event.
type Process struct {
	// Pid is the process's pid inside the sandbox; it is also its process
	// group id.
	Pid int

	c      *Client
	s      *cstream
	ctx    context.Context
	cancel context.CancelFunc
	events chan Event

	mu      sync.Mutex
	pumping bool // Events started the pump (guarded by mu)
	// ended: the stream is done (direct reads by Wait and Collect;
	// guarded by mu).
	ended bool
	// Set by the pump before events is closed, or by a direct read before
	// ended is set.
	exited bool
	status ExitStatus
	err    error
}

func newProcess(c *Client, s *cstream, pid int) *Process {
	ctx, cancel := context.WithCancel(context.Background())
	return &Process{Pid: pid, c: c, s: s, ctx: ctx, cancel: cancel, events: make(chan Event, 4)}
}

// event turns the stream's next frame (or the error reading it) into an
// event. It returns false once the stream is done, having set p.err; an
// exit event sets p.exited and p.status.
func (p *Process) event(f Frame, err error) (Event, bool) {
	if err != nil {
		if p.ctx.Err() != nil {
			err = ErrDetached
		}
		p.err = err
		return Event{}, false
	}
	switch f.Type {
	case FrameStdout, FrameStderr:
		ev := Event{Type: EventStdout, Data: f.Payload}
		if f.Type == FrameStderr {
			ev.Type = EventStderr
		}
		return ev, true
	case FrameExit:
		var m exitMsg
		if err := decodeJSON(f.Payload, &m); err != nil {
			p.err = protoErr("bad exit: %v", err)
			return Event{}, false
		}
		if len(m.Signal) > 16 {
			m.Signal = m.Signal[:16]
		}
		p.exited, p.status = !m.Running, ExitStatus{Code: m.Code, Signal: m.Signal}
		return Event{Type: EventExit, ExitCode: m.Code, Signal: m.Signal, Running: m.Running}, true
	case FrameError:
		p.err = decodeError(f.Payload)
		return Event{}, false
	default:
		p.err = protoErr("unexpected %s frame while following process %d", f.Type, p.Pid)
		p.s.reset()
		return Event{}, false
	}
}

// pump turns the stream's frames into events.
func (p *Process) pump() {
	defer close(p.events)
	for {
		ev, ok := p.event(p.s.next(p.ctx))
		if !ok {
			return
		}
		select {
		case p.events <- ev:
		case <-p.ctx.Done():
			if ev.Type != EventExit {
				p.err = ErrDetached
			}
			return
		}
		if ev.Type == EventExit {
			return
		}
		p.s.consumed(len(ev.Data))
	}
}

// direct reports whether Wait and Collect read the stream themselves: no
// pump has been started. Once it has, they read its events.
func (p *Process) direct() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.pumping
}

// readDirect reads the next event in the caller's goroutine. It returns
// false when the stream is done (result says how), or ctx's error if ctx
// ended first (the process is still followed: read again later).
func (p *Process) readDirect(ctx context.Context) (Event, bool, error) {
	p.mu.Lock()
	ended := p.ended
	p.mu.Unlock()
	if ended {
		return Event{}, false, nil
	}
	f, err := p.s.next(ctx)
	if err != nil && ctx.Err() != nil && p.ctx.Err() == nil && errors.Is(err, ctx.Err()) {
		return Event{}, false, ctx.Err()
	}
	ev, ok := p.event(f, err)
	if ok && ev.Type != EventExit {
		p.s.consumed(len(ev.Data))
	}
	if !ok || ev.Type == EventExit {
		p.mu.Lock()
		p.ended = true
		p.mu.Unlock()
	}
	return ev, ok, nil
}

// Events returns the process's events; the channel is closed after the exit
// event, or early if the connection fails or the Process is closed.
func (p *Process) Events() <-chan Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.pumping {
		p.pumping = true
		if p.ended {
			close(p.events) // read to its end by Wait or Collect
		} else {
			go p.pump()
		}
	}
	return p.events
}

// result is the outcome once events is closed.
func (p *Process) result() (ExitStatus, error) {
	if p.exited {
		return p.status, nil
	}
	if p.err == nil {
		return ExitStatus{}, ErrDetached
	}
	return ExitStatus{}, p.err
}

// Wait discards output until the process exits and returns its status. If
// ctx ends first it returns ctx's error; the process keeps running.
func (p *Process) Wait(ctx context.Context) (ExitStatus, error) {
	for p.direct() {
		ev, ok, err := p.readDirect(ctx)
		switch {
		case err != nil:
			return ExitStatus{}, err
		case !ok:
			return p.result()
		case ev.Type == EventExit:
			return ExitStatus{Code: ev.ExitCode, Signal: ev.Signal}, nil
		}
	}
	for {
		select {
		case ev, ok := <-p.events:
			if !ok {
				return p.result()
			}
			if ev.Type == EventExit {
				return ExitStatus{Code: ev.ExitCode, Signal: ev.Signal}, nil
			}
		case <-ctx.Done():
			return ExitStatus{}, ctx.Err()
		}
	}
}

// Collect gathers stdout and stderr, each up to maxBytes (the rest is read
// and discarded, and truncated is set), until the process exits. If ctx ends
// or the stream fails first, it returns what it has with the error.
func (p *Process) Collect(ctx context.Context, maxBytes int) (stdout, stderr []byte, truncated bool, status ExitStatus, err error) {
	add := func(dst, b []byte) []byte {
		if room := maxBytes - len(dst); len(b) > room {
			truncated = true
			b = b[:max(room, 0)]
		}
		return append(dst, b...)
	}
	for p.direct() {
		ev, ok, err := p.readDirect(ctx)
		switch {
		case err != nil:
			return stdout, stderr, truncated, ExitStatus{}, err
		case !ok:
			status, err = p.result()
			return stdout, stderr, truncated, status, err
		case ev.Type == EventStdout:
			stdout = add(stdout, ev.Data)
		case ev.Type == EventStderr:
			stderr = add(stderr, ev.Data)
		case ev.Type == EventExit:
			return stdout, stderr, truncated, ExitStatus{Code: ev.ExitCode, Signal: ev.Signal}, nil
		}
	}
	for {
		select {
		case ev, ok := <-p.events:
			if !ok {
				status, err = p.result()
				return stdout, stderr, truncated, status, err
			}
			switch ev.Type {
			case EventStdout:
				stdout = add(stdout, ev.Data)
			case EventStderr:
				stderr = add(stderr, ev.Data)
			case EventExit:
				return stdout, stderr, truncated, ExitStatus{Code: ev.ExitCode, Signal: ev.Signal}, nil
			}
		case <-ctx.Done():
			return stdout, stderr, truncated, ExitStatus{}, ctx.Err()
		}
	}
}

// WriteStdin writes to the process's stdin; see Client.WriteStdin.
func (p *Process) WriteStdin(ctx context.Context, data []byte, close bool) error {
	return p.c.WriteStdin(ctx, p.Pid, data, close)
}

// Signal signals the process's group; see Client.Signal.
func (p *Process) Signal(ctx context.Context, sig syscall.Signal) error {
	return p.c.Signal(ctx, p.Pid, sig)
}

// Close stops following the process. A foreground process that has not
// exited is killed with its process group; a background one keeps running
// and can be attached to again. Close is idempotent.
func (p *Process) Close() error {
	p.cancel()
	p.s.reset()
	return nil
}

// Exec starts a process and follows it. ctx bounds only the start: cancel
// a running process with Signal or Close. Stdin larger than the initial
// window is sent in the background as the process consumes it.
func (c *Client) Exec(ctx context.Context, req ExecRequest) (*Process, error) {
	m := execMsg{Argv: req.Argv, Shell: req.Shell, Cwd: req.Cwd, Env: req.Env, Tag: req.Tag,
		Background: req.Background, StdinStream: len(req.Stdin) > 0, StdinOpen: req.StdinOpen || req.Pty != nil, Pty: req.Pty}
	s, err := c.open(FrameExec, m)
	if err != nil {
		return nil, fmt.Errorf("agent exec: %w", err)
	}
	if m.StdinStream {
		send := func(ctx context.Context) {
			if s.sendData(ctx, req.Stdin) == nil {
				c.write(FrameEOF, s.id, nil)
			}
		}
		if len(req.Stdin) <= InitialWindow {
			send(context.Background()) // within the initial credit: never waits
		} else {
			go send(context.Background()) // ends when the stream does
		}
	}
	f, err := s.next(ctx)
	if err != nil {
		s.reset()
		return nil, fmt.Errorf("agent exec: %w", err)
	}
	switch f.Type {
	case FrameStarted:
		var st startedMsg
		if err := decodeJSON(f.Payload, &st); err != nil || st.Pid <= 0 {
			s.reset()
			return nil, protoErr("bad started reply %q", f.Payload)
		}
		return newProcess(c, s, st.Pid), nil
	default:
		err := finalReply(f, nil)
		if err == nil {
			err = protoErr("exec ended without starting")
		}
		s.reset()
		return nil, err
	}
}

// Attach follows a process the agent knows (running, or an exited
// background process it still retains): first the output it buffered (up
// to RingSize, oldest first), then live output and the exit. Closing the
// returned Process only detaches.
func (c *Client) Attach(ctx context.Context, pid int) (*Process, error) {
	return c.attach(ctx, pidMsg{Pid: pid})
}

// Snapshot returns the output of process pid retained so far (as Attach)
// and then one exit event: the exit status, or Running set if the process
// has not exited yet.
func (c *Client) Snapshot(ctx context.Context, pid int) (*Process, error) {
	return c.attach(ctx, pidMsg{Pid: pid, Snapshot: true})
}

func (c *Client) attach(ctx context.Context, req pidMsg) (*Process, error) {
	pid := req.Pid
	s, err := c.open(FrameAttach, req)
	if err != nil {
		return nil, fmt.Errorf("agent attach: %w", err)
	}
	f, err := s.next(ctx)
	if err != nil {
		s.reset()
		return nil, fmt.Errorf("agent attach: %w", err)
	}
	if f.Type != FrameStarted {
		err := finalReply(f, nil)
		if err == nil {
			err = protoErr("attach ended without starting")
		}
		s.reset()
		return nil, err
	}
	var info ProcessInfo
	if err := decodeJSON(f.Payload, &info); err != nil || info.Pid != pid {
		s.reset()
		return nil, protoErr("bad attach reply")
	}
	return newProcess(c, s, pid), nil
}

// items reads Items frames of T until the Result. A truncated listing
// returns the items with an *Error of code CodeTooLarge.
func items[T any](ctx context.Context, c *Client, t FrameType, req any) ([]T, error) {
	s, err := c.open(t, req)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", t, err)
	}
	var all []T
	for {
		f, err := s.next(ctx)
		if err != nil {
			s.reset()
			return nil, fmt.Errorf("agent %s: %w", t, err)
		}
		if f.Type != FrameItems {
			var m truncMsg
			if err := finalReply(f, &m); err != nil {
				s.reset()
				return nil, err
			}
			if m.Truncated {
				return all, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("%s truncated after %d entries", t, len(all))}
			}
			return all, nil
		}
		var batch []T
		if err := decodeJSON(f.Payload, &batch); err != nil {
			s.reset()
			return nil, protoErr("bad %s items: %v", t, err)
		}
		if len(all)+len(batch) > MaxListEntries {
			s.reset()
			return nil, protoErr("%s sent more than %d entries", t, MaxListEntries)
		}
		all = append(all, batch...)
		s.consumed(len(f.Payload))
	}
}

// Processes lists the processes the agent knows, oldest first.
func (c *Client) Processes(ctx context.Context) ([]ProcessInfo, error) {
	return items[ProcessInfo](ctx, c, FrameProcesses, emptyMsg{})
}

// WriteStdin writes data to the stdin of process pid, closing it afterwards
// if close is set. It returns once the data is in the pipe; it waits while
// the process does not read.
func (c *Client) WriteStdin(ctx context.Context, pid int, data []byte, close bool) error {
	s, err := c.open(FrameStdin, stdinMsg{Pid: pid, Close: close})
	if err != nil {
		return fmt.Errorf("agent stdin: %w", err)
	}
	if err := c.upload(ctx, s, func(yield func([]byte) error) error { return yield(data) }); err != nil {
		return err
	}
	var m countMsg
	return c.finish(ctx, s, &m)
}

// upload sends the chunks produced by gen, then the EOF. If the agent ends
// the stream early its error is returned.
func (c *Client) upload(ctx context.Context, s *cstream, gen func(yield func([]byte) error) error) error {
	err := gen(func(b []byte) error { return s.sendData(ctx, b) })
	if err == nil {
		err = c.write(FrameEOF, s.id, nil)
	}
	if errors.Is(err, errEnded) {
		if err := c.finish(ctx, s, &countMsg{}); err != nil {
			return err
		}
		return protoErr("stream ended before the upload did")
	}
	if err != nil {
		s.reset()
		return err
	}
	return nil
}

// finish reads the final reply.
func (c *Client) finish(ctx context.Context, s *cstream, result any) error {
	f, err := s.next(ctx)
	if err != nil {
		s.reset()
		return err
	}
	if err := finalReply(f, result); err != nil {
		s.reset()
		return err
	}
	return nil
}

// Signal sends sig to the process group of process pid (signal 0 checks that
// the group has a live member).
func (c *Client) Signal(ctx context.Context, pid int, sig syscall.Signal) error {
	return c.call(ctx, FrameSignal, signalMsg{Pid: pid, Signal: int(sig)}, nil)
}

// FrameKillProcesses kills every process the agent started and all their
// descendants (workload processes and code-context interpreters); the agent
// and the sandbox live on. The Result is {"killed": N}.
const FrameKillProcesses FrameType = 0x16

// KillProcesses kills every workload process of the sandbox (everything
// the agent started, their descendants, code-context interpreters) and
// returns how many it killed. The agent and the sandbox live on.
func (c *Client) KillProcesses(ctx context.Context) (int, error) {
	var m struct {
		Killed int `json:"killed"`
	}
	err := c.call(ctx, FrameKillProcesses, struct{}{}, &m)
	return m.Killed, err
}

// ReadFile streams a regular file from the sandbox. ctx bounds the whole
// read. Non-regular files (FIFOs, devices, sockets) are refused with
// CodeNotRegular, directories with CodeIsADirectory.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	s, err := c.open(FrameReadFile, pathMsg{Path: path})
	if err != nil {
		return nil, fmt.Errorf("agent read_file: %w", err)
	}
	f, err := s.next(ctx)
	if err != nil {
		s.reset()
		return nil, fmt.Errorf("agent read_file: %w", err)
	}
	if f.Type != FrameStarted {
		err := finalReply(f, nil)
		if err == nil {
			err = protoErr("read_file ended without starting")
		}
		s.reset()
		return nil, err
	}
	var st startedMsg
	if err := decodeJSON(f.Payload, &st); err != nil {
		s.reset()
		return nil, protoErr("bad read_file reply: %v", err)
	}
	return &fileReader{ctx: ctx, s: s}, nil
}

type fileReader struct {
	ctx    context.Context
	s      *cstream
	cur    []byte // rest of the current Data frame
	curLen int
	total  int64
	err    error
}

// Read implements io.Reader, granting the agent credit as data is consumed.
func (r *fileReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if r.curLen > 0 {
			r.s.consumed(r.curLen)
			r.curLen = 0
		}
		f, err := r.s.next(r.ctx)
		if err != nil {
			r.err = err
			r.s.reset()
			continue
		}
		switch f.Type {
		case FrameData:
			r.cur, r.curLen = f.Payload, len(f.Payload)
			r.total += int64(len(f.Payload))
		default:
			var m countMsg
			r.err = finalReply(f, &m)
			if r.err == nil && m.Bytes != r.total {
				r.err = protoErr("read_file sent %d bytes but reported %d", r.total, m.Bytes)
			}
			if r.err == nil {
				r.err = io.EOF
			} else {
				r.s.reset()
			}
		}
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// Close abandons the read if it is not finished.
func (r *fileReader) Close() error {
	if r.err != io.EOF {
		r.s.reset()
	}
	if r.err == nil {
		r.err = ErrDetached
	}
	return nil
}

// WriteFile writes r to a regular file in the sandbox, creating missing
// parent directories, and returns the bytes written. mode (permission bits
// plus setuid/setgid/sticky) is applied exactly; 0 means 0644 for a new file
// and leaves an existing file's mode alone. An existing non-regular file is
// refused with CodeNotRegular.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) (int64, error) {
	return c.writeFile(ctx, writeFileMsg{Path: path}, r, mode)
}

// WriteFileMetadata is WriteFile that also makes md the file's whole
// user-defined metadata (user.e2b.* extended attributes; keys it lacks are
// removed; see CheckMetadata).
func (c *Client) WriteFileMetadata(ctx context.Context, path string, r io.Reader, md map[string]string) (int64, error) {
	if err := CheckMetadata(md); err != nil {
		return 0, &Error{Code: CodeInvalidArgument, Message: err.Error()}
	}
	return c.writeFile(ctx, writeFileMsg{Path: path, SetMetadata: true, Metadata: md}, r, 0)
}

func (c *Client) writeFile(ctx context.Context, msg writeFileMsg, r io.Reader, mode os.FileMode) (int64, error) {
	perm := uint32(mode.Perm())
	if mode&os.ModeSetuid != 0 {
		perm |= 0o4000
	}
	if mode&os.ModeSetgid != 0 {
		perm |= 0o2000
	}
	if mode&os.ModeSticky != 0 {
		perm |= 0o1000
	}
	msg.Mode = perm
	s, err := c.open(FrameWriteFile, msg)
	if err != nil {
		return 0, fmt.Errorf("agent write_file: %w", err)
	}
	err = c.upload(ctx, s, func(yield func([]byte) error) error {
		buf := make([]byte, sendChunk)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if err := yield(buf[:n]); err != nil {
					return err
				}
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return fmt.Errorf("agent write_file: reading source: %w", err)
			}
		}
	})
	if err != nil {
		return 0, err
	}
	var m countMsg
	if err := c.finish(ctx, s, &m); err != nil {
		return 0, err
	}
	return m.Bytes, nil
}

// Remove removes a path and, for a directory, everything below it. A
// missing path is CodeNotFound.
func (c *Client) Remove(ctx context.Context, path string) error {
	return c.call(ctx, FrameRemove, pathMsg{Path: path}, nil)
}

// Mkdir creates a directory and any missing parents (mode 0755).
func (c *Client) Mkdir(ctx context.Context, path string) error {
	return c.call(ctx, FrameMkdir, pathMsg{Path: path}, nil)
}

// Move renames from to to (rename(2) semantics; across file systems it fails
// with CodeCrossDevice).
func (c *Client) Move(ctx context.Context, from, to string) error {
	return c.call(ctx, FrameMove, moveMsg{From: from, To: to}, nil)
}

// Stat describes path without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	if err := c.call(ctx, FrameStat, pathMsg{Path: path}, &fi); err != nil {
		return FileInfo{}, err
	}
	return sanitizeInfo(fi), nil
}

// List lists the tree under the directory path, depth levels deep (1: the
// directory's entries only; at most 64), depth-first in name order, not
// following symlinks. Beyond MaxListEntries it returns the entries so far
// with an *Error of code CodeTooLarge.
func (c *Client) List(ctx context.Context, path string, depth int) ([]FileInfo, error) {
	all, err := items[FileInfo](ctx, c, FrameList, listMsg{Path: path, Depth: depth})
	for i := range all {
		all[i] = sanitizeInfo(all[i])
	}
	return all, err
}

// sanitizeInfo normalizes fields a hostile agent could set to nonsense.
func sanitizeInfo(fi FileInfo) FileInfo {
	switch fi.Type {
	case TypeFile, TypeDir, TypeSymlink:
	default:
		fi.Type = TypeOther
	}
	fi.Mode &= os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky
	return fi
}
