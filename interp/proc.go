package interp

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
)

// Why the Go side killed a kernel process.
const (
	killNone      = iota
	killInterrupt // it did not stop a cell within KillAfter of the interrupt
	killRestart   // Restart
	killClose     // Close
	killProtocol  // it broke the protocol
)

// proc is one kernel process and the goroutines reading its pipes.
type proc struct {
	lang Language
	cmd  *exec.Cmd
	pid  int

	reqMu sync.Mutex // serializes writes to req
	req   *os.File   // request pipe, write end

	chunks  chan chunk // stdout and stderr data, then one eof chunk each
	msgs    chan kmsg  // parsed messages, then one with eof set
	exited  chan struct{}
	exitErr error // set before exited is closed

	files   []*os.File // our read ends, closed by release
	stop    chan struct{}
	release sync.Once

	mu         sync.Mutex
	killReason int
	killDetail string

	// Stream state, touched only by the goroutine running a cell.
	hold [2][]byte // unprocessed data: a partial marker or UTF-8 sequence,
	// output after a marker whose message has not come yet, or output
	// after the end of the last cell
	eof [2]bool
	// msgEOF is set once the message pipe has ended.
	msgEOF bool
	// dead is set once exited has been observed.
	dead bool
}

// chunk is a piece of stdout (stream 0) or stderr (stream 1).
type chunk struct {
	stream int
	buf    *[]byte      // nil for eof
	free   chan *[]byte // where buf goes back once used
	n      int
	eof    bool
}

// Each stream reader cycles through a few buffers of its own, so that
// output streams through without allocating.
const (
	readBufSize = 32 << 10
	readBufs    = 4
)

// release hands a chunk's buffer back to its reader.
func (c chunk) release() {
	if c.buf != nil {
		c.free <- c.buf
	}
}

// kmsg is a message from a kernel.
type kmsg struct {
	Type        string            `json:"type"`
	Sync        [2]int            `json:"sync"`
	N           int               `json:"n"`
	Data        map[string]string `json:"data"`
	Truncated   bool              `json:"truncated"`
	Main        bool              `json:"main"`
	Name        string            `json:"name"`
	Value       string            `json:"value"`
	Traceback   []string          `json:"traceback"`
	Interrupted bool              `json:"interrupted"`
	Status      *int              `json:"status"`
	Pid         int               `json:"pid"`
	Version     string            `json:"version"`

	eof      bool
	oversize int // the line was this long and dropped
}

var sigintOnce sync.Once

// sigintDeliverable makes sure kernels start with SIGINT at its default
// disposition. A process that ignores SIGINT (say, a test binary started in
// the background by a shell without job control) passes that on to its
// children, and bash cannot undo it. Registering a (never read) Notify
// channel keeps this process ignoring SIGINT in effect, while Go resets
// signals it handles to the default in the children it starts.
func sigintDeliverable() {
	sigintOnce.Do(func() {
		if signal.Ignored(os.Interrupt) {
			signal.Notify(make(chan os.Signal, 1), os.Interrupt)
		}
	})
}

// startProc starts a kernel process. The caller waits for its ready message.
func startProc(cfg *Config, token string) (*proc, error) {
	sigintDeliverable()
	l := cfg.launch(token)
	var pipes [4][2]*os.File // requests, messages, stdout, stderr: {read, write}
	for i := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			for _, pp := range pipes[:i] {
				pp[0].Close()
				pp[1].Close()
			}
			return nil, fmt.Errorf("interp: creating pipes: %w", err)
		}
		pipes[i] = [2]*os.File{r, w}
	}
	reqR, reqW := pipes[0][0], pipes[0][1]
	msgR, msgW := pipes[1][0], pipes[1][1]
	outR, outW := pipes[2][0], pipes[2][1]
	errR, errW := pipes[3][0], pipes[3][1]
	closeChildEnds := func() {
		reqR.Close()
		msgW.Close()
		outW.Close()
		errW.Close()
	}

	cmd := exec.Command(l.argv[0], l.argv[1:]...)
	cmd.Dir = cfg.Cwd
	cmd.Env = cfg.kernelEnv()
	if l.stdinIsRequests {
		cmd.Stdin = reqR
	}
	cmd.Stdout = outW
	cmd.Stderr = errW
	cmd.ExtraFiles = []*os.File{reqR, msgW, outW, errW} // fds 3, 4, 5, 6
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cfg.Credential, AmbientCaps: cfg.AmbientCaps}
	if cfg.SysProcAttr != nil {
		cmd.SysProcAttr = cfg.SysProcAttr(cmd.SysProcAttr)
	}
	start := cmd.Start
	if cfg.Spawn != nil {
		start = func() error { return cfg.Spawn(cmd.Start) }
	}
	if err := start(); err != nil {
		closeChildEnds()
		reqW.Close()
		msgR.Close()
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("interp: starting %s kernel: %w", cfg.Language, err)
	}
	closeChildEnds()
	p := &proc{
		lang:   cfg.Language,
		cmd:    cmd,
		pid:    cmd.Process.Pid,
		req:    reqW,
		chunks: make(chan chunk, 16),
		msgs:   make(chan kmsg, 16),
		exited: make(chan struct{}),
		files:  []*os.File{msgR, outR, errR},
		stop:   make(chan struct{}),
	}
	go func() {
		p.exitErr = cmd.Wait()
		close(p.exited)
	}()
	go p.readStream(0, outR)
	go p.readStream(1, errR)
	go p.readMsgs(msgR, cfg.MaxResult+64<<10)
	go p.write(l.preamble)
	return p, nil
}

// write sends bytes on the request pipe. It blocks while the kernel does not
// read, so callers that must stay responsive run it in a goroutine. A failed
// write means the kernel is gone, which the exit and EOF watchers report.
func (p *proc) write(b []byte) error {
	p.reqMu.Lock()
	defer p.reqMu.Unlock()
	_, err := p.req.Write(b)
	return err
}

func (p *proc) readStream(i int, f *os.File) {
	free := make(chan *[]byte, readBufs)
	for range readBufs {
		b := make([]byte, readBufSize)
		free <- &b
	}
	for {
		var bp *[]byte
		select {
		case bp = <-free:
		case <-p.stop:
			return
		}
		n, err := f.Read(*bp)
		if n > 0 {
			select {
			case p.chunks <- chunk{stream: i, buf: bp, free: free, n: n}:
			case <-p.stop:
				return
			}
		} else {
			free <- bp
		}
		if err != nil {
			select {
			case p.chunks <- chunk{stream: i, eof: true}:
			case <-p.stop:
			}
			return
		}
	}
}

// readMsgs parses JSON lines from the message pipe. A line longer than limit
// is dropped (reported as oversize) rather than buffered.
func (p *proc) readMsgs(f *os.File, limit int) {
	br := bufio.NewReaderSize(f, 64<<10)
	var line []byte
	size := 0
	deliver := func(m kmsg) bool {
		select {
		case p.msgs <- m:
			return true
		case <-p.stop:
			return false
		}
	}
	for {
		frag, err := br.ReadSlice('\n')
		size += len(frag)
		if size <= limit {
			line = append(line, frag...)
		} else {
			line = line[:0]
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			deliver(kmsg{eof: true})
			return
		}
		var m kmsg
		if size > limit {
			m = kmsg{Type: "oversize", oversize: size}
		} else if jerr := json.Unmarshal(line, &m); jerr != nil {
			p.kill(killProtocol, fmt.Sprintf("unreadable message from the kernel: %v", jerr))
			deliver(kmsg{eof: true})
			return
		}
		if !deliver(m) {
			return
		}
		size = 0
		if cap(line) > 1<<20 {
			line = nil // do not keep a large result's buffer around
		} else {
			line = line[:0]
		}
	}
}

// signal sends sig to the kernel process, or to its whole process group.
func (p *proc) signal(sig syscall.Signal, group bool) {
	if group {
		syscall.Kill(-p.pid, sig)
		return
	}
	p.cmd.Process.Signal(sig)
}

// kill SIGKILLs the kernel's process group, recording why (the first reason
// wins).
func (p *proc) kill(reason int, detail string) {
	p.mu.Lock()
	if p.killReason == killNone {
		p.killReason = reason
		p.killDetail = detail
	}
	p.mu.Unlock()
	p.killGroup()
}

func (p *proc) killGroup() {
	select {
	case <-p.exited:
		// Reaped: only stragglers of the group can be left.
		syscall.Kill(-p.pid, syscall.SIGKILL)
	default:
		p.cmd.Process.Kill()
		syscall.Kill(-p.pid, syscall.SIGKILL)
	}
}

func (p *proc) reason() (int, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killReason, p.killDetail
}

// isDead reports whether the process has exited or abandoned its message
// pipe, without waiting.
func (p *proc) isDead() bool {
	if p.dead || p.msgEOF {
		return true
	}
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// close releases the pipes and stops the reader goroutines. The process
// should be dead or killed.
func (p *proc) close() {
	p.release.Do(func() {
		close(p.stop)
		p.req.Close()
		for _, f := range p.files {
			f.Close()
		}
	})
}

// exitDescription says how the process ended, for error messages.
func (p *proc) exitDescription() string {
	var ee *exec.ExitError
	switch err := p.exitErr; {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		return ee.ProcessState.String()
	default:
		return "exit status unknown" // someone else reaped it
	}
}
