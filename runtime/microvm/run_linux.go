package microvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/runtime/native"
)

// Run implements tier.Runner: a one-shot run (airlock run --runtime
// microvm). It boots a guest whose PID 1 is the agent, runs cfg.Args in
// it through the agent (stdin, stdout and stderr streamed, output counted
// against the policy's limit), and destroys the guest. The policy's wall
// time bounds the command, from the moment the guest is ready; the boot
// is bounded by BootTimeout. A command whose Args[0] is native.AgentPath
// runs the agent binary inside the guest (the CLI's code cells). With
// network (cfg.Listen), the guest's egress streams are handed to
// opts.OnListeners.
func (Tier) Run(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error) {
	return Run(ctx, cfg, opts)
}

// Run is Tier.Run.
func Run(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error) {
	start := time.Now()
	p := cfg.Policy
	var ptySize *agent.PtySize
	if opts.PTY != nil {
		// -t: the command's terminal is one the guest's agent opens; the
		// local pair only carries its bytes (raw: no echo, line editing or
		// signals here), and its size.
		if err := withFD(opts.PTY.Slave, func(fd int) error { _, err := term.MakeRaw(fd); return err }); err != nil {
			err = fmt.Errorf("microvm: -t: %w", err)
			return native.SetupResult(start, err), err
		}
		ptySize = &agent.PtySize{Cols: 80, Rows: 24}
		if ws, err := winsize(opts.PTY.Master); err == nil {
			ptySize = &agent.PtySize{Cols: ws.Col, Rows: ws.Row}
		}
	}
	if len(cfg.Args) == 0 {
		err := errors.New("microvm: no command")
		return native.SetupResult(start, err), err
	}
	if cfg.AgentBinary == "" {
		self, err := os.Executable()
		if err != nil {
			err = fmt.Errorf("microvm: the agent binary: %w", err)
			return native.SetupResult(start, err), err
		}
		cfg.AgentBinary = self
	}
	if cfg.ID == "" {
		cfg.ID = native.NewRunID()
	}
	rio, err := native.NewRunIO(opts, p.Limits.OutputBytes)
	if err != nil {
		return native.SetupResult(start, err), err
	}
	stdin, stdout, stderr := rio.SandboxEnds()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		rio.Started(false)
		return native.SetupResult(start, err), err
	}
	hostEnd, agentEnd := os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "agent")
	defer hostEnd.Close()
	args := []string{native.AgentPath, "__agent", "--user", fmt.Sprintf("%d:%d", p.User.UID, p.User.GID)}
	if p.User.Root {
		args = append(args, "--root-caps="+native.RootCapsArg())
	}
	console := &consoleTail{}
	conR, conW, err := os.Pipe()
	if err != nil {
		agentEnd.Close()
		rio.Started(false)
		return native.SetupResult(start, err), err
	}
	conDone := make(chan struct{})
	go func() {
		io.Copy(console, conR)
		conR.Close()
		close(conDone)
	}()
	inst, listeners, err := Tier{}.Start(native.Config{ID: cfg.ID, Policy: p, Args: args, Stdin: agentEnd, Stdout: conW, Stderr: conW,
		Agent: true, AgentBinary: cfg.AgentBinary, AllowDegraded: cfg.AllowDegraded, HostIDBase: cfg.HostIDBase,
		Image: cfg.Image, Volumes: cfg.Volumes, Listen: cfg.Listen})
	agentEnd.Close()
	conW.Close() // QEMU holds its own
	if err != nil {
		rio.Started(false)
		<-conDone
		if t := console.String(); t != "" {
			err = fmt.Errorf("%w (guest console: %s)", err, t)
		}
		return native.SetupResult(start, err), err
	}
	vm := inst.(*VM)
	defer vm.Destroy()
	if opts.OnListeners != nil && len(listeners) > 0 {
		// The egress port's streams (--net): the caller's proxy serves them.
		opts.OnListeners(cfg.ID, listeners)
	}
	fail := func(err error) (*native.Result, error) {
		rio.Started(false)
		r := native.SetupResult(start, err)
		r.Enforced = vm.Enforced()
		return r, err
	}
	conn, err := net.FileConn(hostEnd)
	if err != nil {
		return fail(fmt.Errorf("microvm: agent connection: %w", err))
	}
	c, err := agent.NewClientConfig(conn, agent.Config{Home: "/workspace"})
	if err != nil {
		conn.Close()
		vm.Destroy()
		<-conDone
		return fail(fmt.Errorf("microvm: agent hello: %w (guest console: %s)", err, console.String()))
	}
	defer c.Close()

	var (
		mu     sync.Mutex
		reason native.Status
	)
	setCause := func(s native.Status) {
		mu.Lock()
		if reason == "" {
			reason = s
		}
		mu.Unlock()
		vm.Destroy()
	}
	ectx, cancel := context.WithTimeout(ctx, BootTimeout)
	proc, err := c.Exec(ectx, agent.ExecRequest{Argv: cfg.Args, Env: p.Env, StdinOpen: stdin != nil, Pty: ptySize})
	cancel()
	if err != nil {
		if strings.Contains(err.Error(), "not found") || strings.Contains(err.Error(), "no such file") {
			err = fmt.Errorf("%s: %w (%v)", cfg.Args[0], native.ErrNotFound, err)
		} else {
			err = fmt.Errorf("microvm: exec: %w", err)
		}
		return fail(err)
	}
	rio.Pump(func() { setCause(native.StatusOutputLimit) })
	timer := time.AfterFunc(p.Limits.WallTime, func() { setCause(native.StatusTimeout) })
	stop := context.AfterFunc(ctx, func() { setCause(native.StatusKilled) })
	if stdin != nil {
		go copyStdin(c, proc.Pid, stdin)
	}
	if ptySize != nil {
		stopResize := followSize(c, proc.Pid, opts.PTY.Master, *ptySize)
		defer stopResize()
	}
	var status agent.ExitStatus
	var exited bool
	var werr error
	for ev := range proc.Events() {
		switch ev.Type {
		case agent.EventStdout:
			stdout.Write(ev.Data)
		case agent.EventStderr:
			stderr.Write(ev.Data)
		case agent.EventExit:
			status, exited = agent.ExitStatus{Code: ev.ExitCode, Signal: ev.Signal}, true
		}
	}
	if !exited {
		_, werr = proc.Wait(context.Background())
	}
	timer.Stop()
	stop()
	rio.Started(true)
	rio.Wait()

	res := &native.Result{Enforced: vm.Enforced(), Wall: time.Since(start)}
	res.WallMS = float64(res.Wall.Microseconds()) / 1000
	if st, err := vm.Stats(); err == nil {
		res.CPUMS = float64(st.CPUTime.Microseconds()) / 1000
		res.PeakMemoryBytes = st.PeakMemoryBytes
	}
	res.Stdout, res.Stderr, res.Truncated = rio.Output()
	mu.Lock()
	res.Status = reason
	mu.Unlock()
	switch {
	case res.Status != "":
		if exited {
			res.ExitCode, res.Signal = status.Code, status.Signal
		}
	case !exited:
		// The guest ended under the command (a kernel panic, the agent
		// killed): say so, with the console's last lines.
		res.Status, res.Error = native.StatusSetupError, fmt.Sprintf("the guest ended before the command did (%v); console: %s", werr, console.String())
	case status.Signal != "":
		res.Status, res.ExitCode, res.Signal = native.StatusKilled, status.Code, status.Signal
	case status.Code != 0:
		res.Status, res.ExitCode = native.StatusNonzeroExit, status.Code
	default:
		res.Status = native.StatusOK
	}
	return res, nil
}

// copyStdin streams the run's stdin to the guest process and closes it at
// end of file.
func copyStdin(c *agent.Client, pid int, in io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if c.WriteStdin(context.Background(), pid, buf[:n], false) != nil {
				return
			}
		}
		if err != nil {
			c.WriteStdin(context.Background(), pid, nil, true)
			return
		}
	}
}

// followSize passes the local terminal's size changes (the caller's, which
// airlock run -t copies to master on SIGWINCH) on to the guest process's
// terminal, until the returned function is called.
func followSize(c *agent.Client, pid int, master *os.File, size agent.PtySize) func() {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			ws, err := winsize(master)
			if err != nil || (ws.Col == size.Cols && ws.Row == size.Rows) {
				continue
			}
			size = agent.PtySize{Cols: ws.Col, Rows: ws.Row}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c.ResizePty(ctx, pid, size)
			cancel()
		}
	}()
	return func() { close(done) }
}

// winsize reads a terminal's size (never 0 by 0).
func winsize(f *os.File) (*unix.Winsize, error) {
	var ws *unix.Winsize
	err := withFD(f, func(fd int) (err error) {
		ws, err = unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
		return err
	})
	if err == nil && (ws.Col == 0 || ws.Row == 0) {
		err = errors.New("no terminal size")
	}
	return ws, err
}

// withFD runs fn on f's descriptor without f.Fd, which would make f
// blocking: a read blocked on it would then keep the descriptor open
// past Close (and the terminal's master would never see the slave go).
func withFD(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// consoleTail keeps the last 4 KiB of a guest's console, to explain a
// failed boot or a guest that ended.
type consoleTail struct {
	mu  sync.Mutex
	buf []byte
}

const consoleTailMax = 4 << 10

func (t *consoleTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > consoleTailMax {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-consoleTailMax:]...)
	}
	t.mu.Unlock()
	return len(p), nil
}

// String is the tail on one line.
func (t *consoleTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(strings.Fields(strings.ToValidUTF8(string(t.buf), "?")), " ")
}
