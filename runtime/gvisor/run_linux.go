package gvisor

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-dev/airlock/runtime/native"
)

// runscFailure is the exit code runsc uses when it fails itself (its
// util.Fatalf); its message is then on the sandbox's stderr.
const runscFailure = 128

// Run starts a one-shot gVisor sandbox, streams its output, enforces the
// wall-clock deadline and the output limit, and returns the result, with
// the statuses native.Run uses. A non-nil error means the sandbox could
// not be built.
//
// runsc reports a program killed by signal N as exit code 128+N, so a
// program that itself exits with 129..159 is reported as killed by that
// signal.
func Run(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error) {
	start := time.Now()
	if cfg.ID == "" {
		cfg.ID = native.NewRunID()
	}
	// runsc's own errors arrive on stderr: keep its tail to explain a
	// runsc failure even when the output is not captured.
	tail := &tailWriter{w: opts.Stderr}
	opts.Stderr = tail
	rio, err := native.NewRunIO(opts, cfg.Policy.Limits.OutputBytes)
	if err != nil {
		return native.SetupResult(start, err), err
	}
	cfg.Stdin, cfg.Stdout, cfg.Stderr = rio.SandboxEnds()
	sb, err := Start(cfg)
	rio.Started(err == nil)
	if err != nil {
		return native.SetupResult(start, err), err
	}
	defer sb.Destroy()

	var (
		mu       sync.Mutex
		reason   native.Status
		setCause = func(s native.Status) {
			mu.Lock()
			if reason == "" {
				reason = s
			}
			mu.Unlock()
			sb.Kill()
		}
	)
	rio.Pump(func() { setCause(native.StatusOutputLimit) })
	timer := time.AfterFunc(cfg.Policy.Limits.WallTime, func() { setCause(native.StatusTimeout) })
	stop := context.AfterFunc(ctx, func() { setCause(native.StatusKilled) })
	state, werr := sb.Wait()
	timer.Stop()
	stop()
	// runsc has exited; the sentry and gofer, which hold the pipes too, may
	// still be going down: make sure they are, then drain.
	sb.Kill()
	rio.Wait()

	res := &native.Result{Enforced: sb.Enforced(), Wall: time.Since(start)}
	res.WallMS = float64(res.Wall.Microseconds()) / 1000
	if st, err := sb.Stats(); err == nil {
		res.CPUMS = float64(st.CPUTime.Microseconds()) / 1000
		res.PeakMemoryBytes = st.PeakMemoryBytes
		if st.OOMKills > 0 {
			mu.Lock()
			if reason == "" {
				reason = native.StatusOOM
			}
			mu.Unlock()
		}
	}
	res.Stdout, res.Stderr, res.Truncated = rio.Output()
	if werr != nil {
		res.Status, res.Error = native.StatusSetupError, werr.Error()
		return res, nil
	}
	code := state.Sys().(syscall.WaitStatus).ExitStatus()
	mu.Lock()
	res.Status = reason
	mu.Unlock()
	if code == runscFailure && res.Status == "" {
		msg := tail.String()
		if i := strings.Index(msg, "running container: "); i >= 0 {
			msg = strings.TrimSpace(msg[i:])
			err := fmt.Errorf("runsc: %s", msg)
			if strings.Contains(msg, "error finding executable") || strings.Contains(msg, "no such file or directory") && strings.Contains(msg, "executable") {
				err = fmt.Errorf("%s: %w (%s)", cfg.Args[0], native.ErrNotFound, msg)
			}
			r := native.SetupResult(start, err)
			r.Enforced, r.Stdout, r.Stderr = res.Enforced, res.Stdout, res.Stderr
			return r, err
		}
	}
	res.ExitCode = code
	if code > 128 && code < 128+65 {
		res.Signal = syscall.Signal(code - 128).String()
	}
	switch {
	case res.Status != "":
	case res.Signal != "":
		res.Status = native.StatusKilled
	case res.ExitCode != 0:
		res.Status = native.StatusNonzeroExit
	default:
		res.Status = native.StatusOK
	}
	return res, nil
}

// tailWriter passes writes on to w (if any) and keeps the last 4 KiB.
type tailWriter struct {
	w   io.Writer
	mu  sync.Mutex
	buf []byte
}

const tailMax = 4 << 10

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailMax {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailMax:]...)
	}
	t.mu.Unlock()
	if t.w != nil {
		return t.w.Write(p)
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
