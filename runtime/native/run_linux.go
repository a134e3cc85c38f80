package native

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// RunOptions says where a one-shot run's streams go.
type RunOptions struct {
	// Stdin is copied to the program; nil means /dev/null.
	Stdin io.Reader
	// Stdout and Stderr receive output as it comes (optional).
	Stdout, Stderr io.Writer
	// Capture keeps stdout/stderr in the Result, up to the output limit.
	Capture bool
	// OnStart, if set, is called once the program runs; the sandbox is
	// destroyed when Run returns.
	OnStart func(*Sandbox)
	// OnListeners, if set, is called once the sandbox runs with the
	// listeners opened inside it for its egress (Config.Listen, in that
	// order), for the caller to serve; sandbox id is the run's Config.ID.
	// Every tier's one-shot run calls it.
	OnListeners func(id string, ls []net.Listener)
	// PTY, if set, is a fresh pseudo-terminal pair (never the caller's own
	// terminal): its slave is the program's stdin, stdout, stderr and
	// controlling terminal; Stdin is typed into its master and what the
	// master reads (counted against the output limit) goes to Stdout.
	PTY *PTY
}

// PTY is the two ends of a pseudo-terminal.
type PTY struct {
	Master, Slave *os.File
}

// limitedSink counts a run's output against its limit and keeps a capped
// copy. Memory never exceeds the limit, whatever the sandbox prints.
type limitedSink struct {
	mu      sync.Mutex
	total   int64
	limit   int64
	over    bool
	onOver  func()
	capture bool
	bufs    [2]bytes.Buffer
}

func (l *limitedSink) write(stream int, p []byte, w io.Writer) {
	l.mu.Lock()
	room := l.limit - l.total
	n := int64(len(p))
	if n > room {
		n = max(room, 0)
	}
	l.total += int64(len(p))
	if l.capture && n > 0 {
		l.bufs[stream].Write(p[:n])
	}
	first := !l.over && l.total > l.limit
	if first {
		l.over = true
	}
	l.mu.Unlock()
	if w != nil && n > 0 {
		_, _ = w.Write(p[:n])
	}
	if first {
		l.onOver()
	}
}

func (l *limitedSink) pump(stream int, r *os.File, w io.Writer, wg *sync.WaitGroup) {
	defer wg.Done()
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			l.write(stream, buf[:n], w)
		}
		if err != nil {
			return
		}
	}
}

// Run starts a one-shot sandbox, streams its output, enforces the wall-clock
// deadline and the output limit, and returns the result. A non-nil error
// means the sandbox could not be built (the Result then has status
// setup_error).
func Run(ctx context.Context, cfg Config, opts RunOptions) (*Result, error) {
	start := time.Now()
	if cfg.ID == "" {
		cfg.ID = NewRunID()
	}
	rio, err := NewRunIO(opts, cfg.Policy.Limits.OutputBytes)
	if err != nil {
		return setupResult(start, err), err
	}
	cfg.Stdin, cfg.Stdout, cfg.Stderr = rio.SandboxEnds()
	cfg.ControllingTerminal = opts.PTY != nil
	sb, err := Start(cfg)
	rio.Started(err == nil)
	if err != nil {
		return setupResult(start, err), err
	}
	defer sb.Destroy()
	if opts.OnStart != nil {
		opts.OnStart(sb)
	}
	if opts.OnListeners != nil {
		opts.OnListeners(sb.ID, sb.Listeners())
	}

	var (
		mu       sync.Mutex
		reason   Status
		setCause = func(s Status) {
			mu.Lock()
			if reason == "" {
				reason = s
			}
			mu.Unlock()
			sb.Kill()
		}
	)
	rio.Pump(func() { setCause(StatusOutputLimit) })
	timer := time.AfterFunc(cfg.Policy.Limits.WallTime, func() { setCause(StatusTimeout) })
	stop := context.AfterFunc(ctx, func() { setCause(StatusKilled) })
	state, werr := sb.Wait()
	timer.Stop()
	stop()
	// The init process is gone, so the kernel has killed the rest of the
	// pid namespace; the pipes drain to EOF.
	rio.Wait()

	res := &Result{Enforced: sb.Enforced(), Wall: time.Since(start)}
	res.WallMS = float64(res.Wall.Microseconds()) / 1000
	if st, err := sb.Stats(); err == nil {
		res.CPUMS = float64(st.CPUTime.Microseconds()) / 1000
		res.PeakMemoryBytes = st.PeakMemoryBytes
		if st.OOMKills > 0 {
			mu.Lock()
			if reason == "" {
				reason = StatusOOM
			}
			mu.Unlock()
		}
	} else if state != nil {
		ru := &state.Rusage
		res.CPUMS = float64((time.Duration(ru.Utime.Nano()) + time.Duration(ru.Stime.Nano())).Microseconds()) / 1000
		res.PeakMemoryBytes = ru.Maxrss * 1024
	}
	res.Stdout, res.Stderr, res.Truncated = rio.Output()
	if werr != nil {
		res.Status, res.Error = StatusSetupError, werr.Error()
		return res, nil
	}
	ws := state.Status
	if state.Traced {
		mu.Lock()
		if reason == "" {
			reason = StatusKilled
		}
		mu.Unlock()
		res.Error = ErrTracedLauncher.Error()
	}
	switch {
	case ws.Signaled():
		res.Signal = ws.Signal().String()
		res.ExitCode = 128 + int(ws.Signal())
	default:
		res.ExitCode = ws.ExitStatus()
	}
	mu.Lock()
	res.Status = reason
	mu.Unlock()
	switch {
	case res.Status != "":
	case ws.Signaled():
		res.Status = StatusKilled
	case res.ExitCode != 0:
		res.Status = StatusNonzeroExit
	default:
		res.Status = StatusOK
	}
	return res, nil
}

func setupResult(start time.Time, err error) *Result {
	r := &Result{Status: StatusSetupError, ExitCode: -1, Error: err.Error(), Wall: time.Since(start)}
	if errors.Is(err, ErrNotFound) {
		r.ExitCode = 127
	} else if errors.Is(err, ErrNotExecutable) {
		r.ExitCode = 126
	}
	r.WallMS = float64(r.Wall.Microseconds()) / 1000
	return r
}
