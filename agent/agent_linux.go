package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// prSetChildSubreaper is prctl's PR_SET_CHILD_SUBREAPER.
const prSetChildSubreaper = 36

// defaultGrace is how long a listening agent waits for a host connection.
const defaultGrace = 10 * time.Minute

// agentThreads is how many OS threads the agent creates up front.
const agentThreads = 8

// prespawnThreads makes the Go runtime create n OS threads now and keep
// them idle for later. A fork bomb inside the sandbox takes every free
// slot of the sandbox's pids limit (threads count as tasks); if the
// runtime then needed a new thread for a blocking system call it would
// abort ("newosproc") and the whole sandbox would die with its agent.
// Idle threads are reused, never freed, so the agent survives and can
// kill the bomb. The cost is a kernel task and a small stack per thread.
func prespawnThreads(n int) {
	var locked, done sync.WaitGroup
	release := make(chan struct{})
	locked.Add(n)
	done.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer done.Done()
			runtime.LockOSThread() // each goroutine pins a distinct thread
			locked.Done()
			<-release
			runtime.UnlockOSThread() // the thread goes back to the idle pool
		}()
	}
	locked.Wait()
	close(release)
	done.Wait()
}

// Main runs the agent on fd 0 and never returns.
//
// If fd 0 is a connected stream socket, the agent serves that one host
// connection and exits when it closes (status 0; 1 on a fatal error), after
// killing every process it started and their descendants.
//
// If fd 0 is a listening socket, the agent accepts host connections on it,
// one at a time (a new one replaces the current one). Processes outlive a
// connection, except foreground processes, which are killed with their
// streams. After a connection ends, or at start, the agent waits for the
// grace period ("--grace DURATION" in its arguments, default 10 minutes)
// for the next one, and if none comes kills everything and exits.
//
// With "--serial=PATH" (a microVM guest), the agent serves that
// character device instead of fd 0, one session per host connection to
// QEMU's end of it, as a listening agent serves its connections
// (serialPort: each session presents the first one's token); with
// "--egress=PATH" it also carries the guest's connections to the host's
// egress proxy (egressRelay), and with "--env-file=PATH" its environment
// is that file's (envFile).
func Main() {
	serial, err := serialListener(os.Args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		os.Exit(1)
	}
	if err := envFile(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		os.Exit(1)
	}
	if err := egressRelay(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		os.Exit(1)
	}
	setup()
	if serial != nil {
		grace, err := graceArg(os.Args)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
			os.Exit(2)
		}
		os.Exit(runListener(serial, grace, nil, func(c net.Conn) bool { return admitSerial(c, true) }))
	}
	f := os.NewFile(0, "host")
	var code int
	if v, err := syscall.GetsockoptInt(0, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN); err == nil && v == 1 {
		grace, err := graceArg(os.Args)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
			os.Exit(2)
		}
		ln, err := net.FileListener(f)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock agent: fd 0: %v\n", err)
			os.Exit(1)
		}
		f.Close() // FileListener holds a close-on-exec duplicate
		code = runListener(ln, grace, nil, nil)
	} else {
		conn, err := net.FileConn(f)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock agent: fd 0 is not a socket: %v\n", err)
			os.Exit(1)
		}
		f.Close() // FileConn holds a close-on-exec duplicate
		if addr, ok := reconnectArg(os.Args); ok {
			code = runReconnectable(conn, addr)
		} else {
			code = run(conn)
		}
	}
	os.Exit(code)
}

// setup prepares the agent process before it serves: memory tuning, the
// tmpfs mounts the gvisor runtime asks for (mountTmpfs), its
// identity (secureIdentity), the spawner thread and the spare threads, and
// close-on-exec on every inherited fd above stderr. It exits on failure.
func setup() {
	// An idle agent should cost little: collect early, and return freed
	// memory to the kernel promptly.
	debug.SetGCPercent(50)
	// Each P costs memory (per-P caches); the agent mostly waits on pipes
	// and sockets, and fork/exec blocks an M, not a P.
	if runtime.GOMAXPROCS(0) > 2 {
		runtime.GOMAXPROCS(2)
	}
	if err := setupWorkloadCgroup(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		os.Exit(1)
	}
	if err := mountTmpfs(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		os.Exit(1)
	}
	qjs, err := quickJSArg(os.Args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		os.Exit(2)
	}
	quickJSKernel = qjs
	if err := secureIdentity(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		os.Exit(1)
	}
	theSpawner = startSpawner()
	if err := theSpawner.run(theWorkload.join); err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		os.Exit(1)
	}
	prespawnThreads(agentThreads)
	cloexecFrom(3)
}

// graceArg finds "--grace DURATION" or "--grace=DURATION" in args.
func graceArg(args []string) (time.Duration, error) {
	for i, arg := range args {
		v, ok := strings.CutPrefix(arg, "--grace=")
		if !ok && arg == "--grace" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return 0, fmt.Errorf("bad --grace %q", v)
			}
			return d, nil
		}
	}
	return defaultGrace, nil
}

// cloexecFrom marks every fd >= lowfd close-on-exec, so that nothing the
// agent inherited beyond its socket and log leaks into the processes it starts.
func cloexecFrom(lowfd int) {
	const sysCloseRange, closeRangeCloexec = 436, 4 // same number on every arch
	if _, _, errno := syscall.Syscall(sysCloseRange, uintptr(lowfd), uintptr(^uint32(0)), closeRangeCloexec); errno == 0 {
		return
	}
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, n := range names {
		if fd, err := strconv.Atoi(n); err == nil && fd >= lowfd {
			syscall.CloseOnExec(fd)
		}
	}
}

// newAgent sets up the process-wide state: subreaper, reaper, signals.
func newAgent() *agent {
	a := &agent{
		env:   os.Environ(),
		procs: make(map[int]*proc),
		quit:  make(chan struct{}),
	}
	// As PID 1 of a pid namespace orphans come to us anyway; outside one
	// (tests, debugging) this makes them come to us too, so that we reap
	// them and can kill them on shutdown.
	syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	a.startReaper()
	a.handleSignals()
	return a
}

// run serves one connection and tears everything down when it ends.
func run(conn net.Conn) int {
	a := newAgent()
	c := a.newConn(conn)
	go func() {
		<-a.quit
		c.close()
	}()
	err := c.serve()
	c.close()
	a.shutdown()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		return 1
	}
	return 0
}

// runListener serves connections from ln until none comes for grace. If
// first is not nil it is served first, as if accepted. If admit is not nil
// every accepted connection goes through it (in its own goroutine) and is
// served only if it returns true; it closes those it refuses.
func runListener(ln net.Listener, grace time.Duration, first net.Conn, admit func(net.Conn) bool) int {
	a := newAgent()
	conns := make(chan net.Conn, 1)
	if first != nil {
		conns <- first
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				fmt.Fprintf(os.Stderr, "airlock agent: accept: %v\n", err)
				close(conns)
				return
			}
			if admit != nil {
				go func() {
					if admit(conn) {
						conns <- conn
					}
				}()
				continue
			}
			conns <- conn
		}
	}()
	ended := make(chan *hostConn, 1)
	var cur *hostConn
	timer := time.NewTimer(grace)
	for {
		select {
		case conn, ok := <-conns:
			if !ok {
				conns = nil // no more connections: wait out the grace
				continue
			}
			if cur != nil {
				cur.close() // replaced; its end is ignored below
			}
			timer.Stop()
			cur = a.newConn(conn)
			go func(c *hostConn) {
				err := c.serve()
				c.close()
				if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
					fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
				}
				ended <- c
			}(cur)
		case c := <-ended:
			if c == cur {
				cur = nil
				timer.Reset(grace)
			}
		case <-timer.C:
			ln.Close()
			a.shutdown()
			return 0
		case <-a.quit:
			ln.Close()
			if cur != nil {
				cur.close()
			}
			a.shutdown()
			return 0
		}
	}
}

// handleSignals keeps catchable signals from killing the agent. As PID 1,
// every one is swallowed: sandboxed code (a stray pkill, or a kill -SEGV)
// must not take the agent down, and the host ends it by closing the socket.
// The Go runtime crashes on a SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
// SIGABRT, SIGSYS or SIGSTKFLT sent with kill unless it is notified: they
// are caught here too (real faults still crash, as they must). Outside a pid
// namespace, SIGTERM, SIGINT and SIGHUP shut it down cleanly. The signals are
// caught, not ignored, so that children start with default dispositions.
func (a *agent) handleSignals() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGPIPE,
		syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGVTALRM, syscall.SIGPROF,
		syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGILL, syscall.SIGTRAP, syscall.SIGABRT,
		syscall.SIGSYS, syscall.SIGSTKFLT, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGPWR, syscall.SIGIO,
		syscall.SIGWINCH)
	pid1 := os.Getpid() == 1
	go func() {
		for sig := range ch {
			if !pid1 && (sig == syscall.SIGTERM || sig == syscall.SIGINT || sig == syscall.SIGHUP) {
				a.quitOnce.Do(func() { close(a.quit) })
			}
		}
	}()
}

// agent is the process-wide state of the in-sandbox agent: the processes it
// started, which outlive any one host connection.
type agent struct {
	env []string

	mu      sync.Mutex
	procs   map[int]*proc
	exited  []*proc // exited background processes, oldest first
	closing bool

	// forkMu is held shared while forking and registering a child, and
	// exclusively by the reaper while it waits for and dispatches exits,
	// so that no exit is reaped before its process is registered.
	forkMu sync.RWMutex

	quit     chan struct{} // closed to shut down (SIGTERM outside a pid namespace)
	quitOnce sync.Once
}

// hostConn is one host connection and its streams. Request handlers are its
// methods; the embedded agent holds the process state they share.
type hostConn struct {
	*agent
	conn net.Conn
	home string

	wmu  sync.Mutex // serializes frame writes
	wbuf []byte
	dead bool // closed or a write failed; guarded by wmu

	smu     sync.Mutex
	streams map[uint32]*astream
	closed  bool // guarded by smu
}

func (a *agent) newConn(conn net.Conn) *hostConn {
	return &hostConn{agent: a, conn: conn, home: "/workspace", streams: make(map[uint32]*astream)}
}

// close ends the connection and every stream on it: followers detach, and
// foreground processes started on it are killed.
func (c *hostConn) close() {
	c.wmu.Lock()
	c.dead = true
	c.wmu.Unlock()
	c.conn.Close()
	c.smu.Lock()
	c.closed = true
	streams := make([]*astream, 0, len(c.streams))
	for _, s := range c.streams {
		streams = append(streams, s)
	}
	c.smu.Unlock()
	for _, s := range streams {
		s.kill(false, nil)
	}
}

// write sends one frame. It is safe for concurrent use.
func (c *hostConn) write(t FrameType, id uint32, payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.dead {
		return net.ErrClosed
	}
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
	if err != nil {
		c.dead = true
		c.conn.Close() // the reader notices and ends the connection
		return fmt.Errorf("writing %s frame: %w", t, err)
	}
	return nil
}

func (c *hostConn) writeJSON(t FrameType, id uint32, v any) error {
	p, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", t, err)
	}
	return c.write(t, id, p)
}

// serve does the hello and then dispatches frames until the connection ends.
func (c *hostConn) serve() error {
	br := bufio.NewReaderSize(c.conn, 4096)
	f, err := ReadFrame(br)
	if err != nil {
		return fmt.Errorf("reading hello: %w", err)
	}
	var h helloMsg
	if f.Type != FrameHello || f.Stream != 0 {
		err = fmt.Errorf("first frame is %s on stream %d, want hello on stream 0", f.Type, f.Stream)
	} else if err = decodeJSON(f.Payload, &h); err == nil && h.Version != Version {
		err = fmt.Errorf("host speaks protocol version %d, agent %d", h.Version, Version)
	} else if err == nil && h.Home != "" && !filepath.IsAbs(h.Home) {
		err = fmt.Errorf("home %q is not absolute", h.Home)
	}
	if err != nil {
		c.writeJSON(FrameError, 0, &Error{Code: CodeProtocol, Message: err.Error()})
		return err
	}
	if h.Home != "" {
		c.home = filepath.Clean(h.Home)
	}
	if err := c.writeJSON(FrameHello, 0, helloMsg{Version: Version, Pid: os.Getpid(), SpawnerTid: spawnerTid(), Layers: reportedLayers}); err != nil {
		return err
	}
	for {
		f, err := ReadFrame(br)
		if err != nil {
			return err
		}
		c.dispatch(f)
	}
}

// dispatch handles one frame from the host. It never blocks on a stream.
func (c *hostConn) dispatch(f Frame) {
	switch f.Type {
	case FramePing:
		c.writeJSON(FrameResult, f.Stream, pongMsg{OOMKills: workloadOOMKills()})
		return
	case FrameWindow, FrameData, FrameEOF, FrameReset:
		c.smu.Lock()
		s := c.streams[f.Stream]
		c.smu.Unlock()
		if s == nil {
			return // finished or reset: late frames are expected
		}
		switch f.Type {
		case FrameWindow:
			n, err := decodeWindow(f.Payload)
			if err != nil {
				s.abort(err)
				return
			}
			s.grant(int64(n))
		case FrameData:
			s.push(f.Payload, false)
		case FrameEOF:
			s.push(nil, true)
		case FrameReset:
			s.resetByHost()
		}
		return
	}
	h, ok := handlers[f.Type]
	if !ok || f.Stream == 0 {
		c.writeJSON(FrameError, f.Stream, &Error{Code: CodeUnsupported,
			Message: fmt.Sprintf("unsupported frame type %s", f.Type)})
		return
	}
	s := newStream(c, f.Stream)
	c.smu.Lock()
	if _, dup := c.streams[f.Stream]; dup || c.closed {
		c.smu.Unlock()
		c.writeJSON(FrameError, f.Stream, &Error{Code: CodeProtocol, Message: "stream id already in use"})
		return
	}
	c.streams[f.Stream] = s
	c.smu.Unlock()
	go func() {
		defer s.release()
		res, err := h(c, s, f.Payload)
		if err != nil {
			s.finishErr(err)
		} else if res != nil {
			s.finish(FrameResult, res)
		}
	}()
}

// handler serves one request. It returns the Result payload, or an error to
// send as the final Error, or (nil, nil) when it has ended the stream itself.
type handler func(c *hostConn, s *astream, payload []byte) (any, error)

var handlers map[FrameType]handler

func init() {
	handlers = map[FrameType]handler{
		FrameExec:          (*hostConn).handleExec,
		FrameAttach:        (*hostConn).handleAttach,
		FrameProcesses:     (*hostConn).handleProcesses,
		FrameStdin:         (*hostConn).handleStdin,
		FrameSignal:        (*hostConn).handleSignal,
		FrameKillProcesses: (*hostConn).handleKillProcesses,
		FrameReadFile:      (*hostConn).handleReadFile,
		FrameWriteFile:     (*hostConn).handleWriteFile,
		FrameRemove:        (*hostConn).handleRemove,
		FrameList:          (*hostConn).handleList,
		FrameStat:          (*hostConn).handleStat,
		FrameMkdir:         (*hostConn).handleMkdir,
		FrameMove:          (*hostConn).handleMove,
	}
	for t, h := range interpHandlers {
		handlers[t] = h
	}
	handlers[FrameWatch] = (*hostConn).handleWatch
	handlers[FrameDial] = (*hostConn).handleDial
	handlers[FramePtyResize] = (*hostConn).handlePtyResize
	handlers[FrameComputer] = (*hostConn).handleComputer
}

// errStreamGone reports that the host reset the stream or the connection
// is gone; nothing more is sent on the stream.
var errStreamGone = errors.New("stream reset or connection closed")

// astream is the agent's side of one stream.
type astream struct {
	c  *hostConn
	id uint32

	mu       sync.Mutex
	cond     sync.Cond
	credit   int64 // bytes of credited payload we may still send
	recvLeft int64 // bytes of Data the host may still send
	unacked  int64 // Data consumed but not yet granted back
	in       [][]byte
	inEOF    bool
	gone     bool // reset by host, aborted, or connection closed
	finished bool // final frame sent
	onReset  []func()
}

func newStream(c *hostConn, id uint32) *astream {
	s := &astream{c: c, id: id, credit: InitialWindow, recvLeft: InitialWindow}
	s.cond.L = &s.mu
	return s
}

// release unregisters the stream once its handler is done.
func (s *astream) release() {
	s.c.smu.Lock()
	if s.c.streams[s.id] == s {
		delete(s.c.streams, s.id)
	}
	s.c.smu.Unlock()
}

// grant adds credit from a Window frame.
func (s *astream) grant(n int64) {
	s.mu.Lock()
	if s.credit += n; s.credit > 1<<40 {
		s.credit = 1 << 40
	}
	s.mu.Unlock()
	s.cond.Broadcast()
}

// push queues Data (or the EOF) from the host.
func (s *astream) push(p []byte, eof bool) {
	s.mu.Lock()
	if s.gone || s.inEOF {
		s.mu.Unlock()
		return
	}
	if int64(len(p)) > s.recvLeft {
		s.mu.Unlock()
		s.abort(fmt.Errorf("host sent %d bytes of data beyond its credit", len(p)))
		return
	}
	s.recvLeft -= int64(len(p))
	if len(p) > 0 {
		s.in = append(s.in, p)
	}
	s.inEOF = s.inEOF || eof
	s.mu.Unlock()
	s.cond.Broadcast()
}

// recv returns the next Data chunk from the host, or eof. It fails when the
// stream is gone.
func (s *astream) recv() (p []byte, eof bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.in) == 0 && !s.inEOF && !s.gone && !s.finished {
		s.cond.Wait()
	}
	switch {
	case s.gone, s.finished:
		return nil, false, errStreamGone
	case len(s.in) > 0:
		p = s.in[0]
		s.in[0] = nil
		s.in = s.in[1:]
		return p, false, nil
	}
	return nil, true, nil
}

// consumed reports n bytes of Data as processed, granting credit back.
func (s *astream) consumed(n int) {
	s.mu.Lock()
	s.unacked += int64(n)
	var grant int64
	if s.unacked >= InitialWindow/4 && !s.gone && !s.finished {
		grant, s.unacked = s.unacked, 0
		s.recvLeft += grant
	}
	s.mu.Unlock()
	if grant > 0 {
		s.c.write(FrameWindow, s.id, encodeWindow(uint32(grant)))
	}
}

// sendData sends credited payload, waiting for credit and splitting as
// needed. It fails with errStreamGone if the stream is reset meanwhile.
func (s *astream) sendData(t FrameType, p []byte) error {
	for len(p) > 0 {
		s.mu.Lock()
		for s.credit <= 0 && !s.gone {
			s.cond.Wait()
		}
		if s.gone {
			s.mu.Unlock()
			return errStreamGone
		}
		n := int64(len(p))
		if n > s.credit {
			n = s.credit
		}
		s.credit -= n
		s.mu.Unlock()
		if err := s.c.write(t, s.id, p[:n]); err != nil {
			s.abort(err)
			return errStreamGone
		}
		p = p[n:]
	}
	return nil
}

// sendWhole sends credited payload as one frame, waiting until the credit
// covers all of it (Items frames must not be split). len(p) must be at most
// InitialWindow/2, so that the host's batched grants always suffice.
func (s *astream) sendWhole(t FrameType, p []byte) error {
	s.mu.Lock()
	for s.credit < int64(len(p)) && !s.gone {
		s.cond.Wait()
	}
	if s.gone {
		s.mu.Unlock()
		return errStreamGone
	}
	s.credit -= int64(len(p))
	s.mu.Unlock()
	if err := s.c.write(t, s.id, p); err != nil {
		s.abort(err)
		return errStreamGone
	}
	return nil
}

// send sends a non-final control frame.
func (s *astream) send(t FrameType, v any) error {
	s.mu.Lock()
	gone := s.gone
	s.mu.Unlock()
	if gone {
		return errStreamGone
	}
	return s.c.writeJSON(t, s.id, v)
}

// finish sends the final frame, unless the stream is already gone.
func (s *astream) finish(t FrameType, v any) {
	s.mu.Lock()
	if s.gone || s.finished {
		s.mu.Unlock()
		return
	}
	s.finished = true
	s.mu.Unlock()
	s.cond.Broadcast()
	s.release()
	s.c.writeJSON(t, s.id, v)
}

// finishErr ends the stream with an Error built from err.
func (s *astream) finishErr(err error) {
	if errors.Is(err, errStreamGone) {
		return
	}
	s.finish(FrameError, toError(err))
}

// onGone registers fn to run when the stream is reset or aborted (at once
// if it already is). fn must not block.
func (s *astream) onGone(fn func()) {
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		fn()
		return
	}
	s.onReset = append(s.onReset, fn)
	s.mu.Unlock()
}

// resetByHost handles a Reset frame.
func (s *astream) resetByHost() { s.kill(false, nil) }

// abort resets the stream from our side, telling the host why.
func (s *astream) abort(err error) { s.kill(true, err) }

func (s *astream) kill(tell bool, why error) {
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return
	}
	s.gone = true
	fns := s.onReset
	s.onReset = nil
	tell = tell && !s.finished
	s.finished = true
	s.in = nil
	s.mu.Unlock()
	s.cond.Broadcast()
	s.release()
	if tell {
		e := toError(why)
		e.Code = CodeProtocol
		s.c.writeJSON(FrameError, s.id, e)
	}
	for _, fn := range fns {
		fn()
	}
}

// shutdown kills every process started by the agent and every descendant,
// reaps them, and leaves the agent ready to exit.
func (a *agent) shutdown() {
	a.mu.Lock()
	a.closing = true
	procs := make([]*proc, 0, len(a.procs))
	for _, p := range a.procs {
		procs = append(procs, p)
	}
	a.mu.Unlock()
	for _, p := range procs {
		p.mu.Lock()
		running := !p.exited
		p.mu.Unlock()
		if running {
			syscall.Kill(-p.pid, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		n := killDescendants()
		a.forkMu.Lock()
		children := a.reapAll()
		a.forkMu.Unlock()
		if n == 0 && !children {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
