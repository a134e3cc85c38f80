package wasm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
)

// Module is a WebAssembly binary and the name it runs under.
type Module struct {
	// Name is argv[0] as the guest sees it.
	Name string
	// Bytes is the binary (a WASI preview 1 command module).
	Bytes []byte
}

// ReadModule reads a module file from the host, once, refusing files over
// MaxModuleBytes.
func ReadModule(path string) (Module, error) {
	f, err := os.Open(path)
	if err != nil {
		return Module{}, fmt.Errorf("%w: %v", ErrModule, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxModuleBytes+1))
	if err != nil {
		return Module{}, fmt.Errorf("%w: reading %s: %v", ErrModule, path, err)
	}
	if len(b) > MaxModuleBytes {
		return Module{}, fmt.Errorf("%w: %s is larger than %d bytes", ErrModule, path, MaxModuleBytes)
	}
	return Module{Name: path, Bytes: b}, nil
}

// Run is `airlock run --runtime wasm`: cfg.Args[0] is a module file on the
// host (read once), the rest its arguments. It uses a fresh engine on the
// default disk cache. A non-nil error means the module could not be
// started (the Result then has status setup_error).
func Run(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error) {
	start := time.Now()
	if len(cfg.Args) == 0 {
		err := fmt.Errorf("%w: no module given", ErrModule)
		return setupResult(start, err), err
	}
	m, err := ReadModule(cfg.Args[0])
	if err != nil {
		return setupResult(start, err), err
	}
	dir, err := DefaultCacheDir()
	if err != nil {
		return setupResult(start, err), err
	}
	e, err := NewEngine(ctx, dir)
	if err != nil {
		return setupResult(start, err), err
	}
	defer e.Close()
	return e.Run(ctx, m, cfg, opts)
}

func setupResult(start time.Time, err error) *native.Result {
	w := time.Since(start)
	return &native.Result{Status: native.StatusSetupError, ExitCode: 126, Error: err.Error(), Wall: w,
		WallMS: float64(w.Microseconds()) / 1000}
}

// Causes of a run's end that the host decided.
var (
	errTimeout     = errors.New("wall-time limit reached")
	errOutputLimit = errors.New("output limit reached")
)

// exitKilled is the exit code reported when the host stops the module,
// as native reports a SIGKILL.
const exitKilled = 128 + 9

// Run runs one module instance under cfg.Policy: cfg.Args is argv
// (argv[0] names the module), cfg.Stdin/Stdout/Stderr are ignored in
// favour of opts. The workspace is cfg.Policy.Filesystem.Workspace, or a
// fresh directory removed afterwards.
func (e *Engine) Run(ctx context.Context, m Module, cfg native.Config, opts native.RunOptions) (*native.Result, error) {
	start := time.Now()
	p := &cfg.Policy
	if err := p.Validate(); err != nil {
		return setupResult(start, err), err
	}
	compiled, err := e.compile(ctx, m.Bytes)
	if err != nil {
		return setupResult(start, err), err
	}
	limit := memoryLimit(p.Limits.MemoryBytes)
	for _, d := range append(compiled.ImportedMemories(), exportedMemories(compiled)...) {
		if uint64(d.Min())<<16 > limit {
			err := fmt.Errorf("%w: its initial memory (%d pages) is over the %d-byte memory limit", ErrModule, d.Min(), limit)
			res := setupResult(start, err)
			res.Status, res.ExitCode = native.StatusOOM, exitKilled
			return res, nil
		}
	}
	pre, cleanup, err := preopens(p)
	if err != nil {
		return setupResult(start, err), err
	}
	defer cleanup()

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	runCtx, cancelT := context.WithTimeoutCause(runCtx, p.Limits.WallTime, errTimeout)
	defer cancelT()

	if e.stop != nil {
		// No context checks in the module's code (WithoutContextChecks).
		ended := make(chan struct{})
		defer close(ended)
		go func() {
			select {
			case <-ended:
				return
			case <-runCtx.Done():
			}
			t := time.NewTimer(stopGrace)
			defer t.Stop()
			select {
			case <-ended:
			case <-t.C:
				e.stop()
			}
		}()
	}

	sink := &sink{limit: p.Limits.OutputBytes, capture: opts.Capture, onOver: func() { cancel(errOutputLimit) }}
	mem := &memAllocator{limit: limit}
	fsc := wazero.NewFSConfig()
	for _, po := range pre {
		fsc = fsc.(sysfs.FSConfig).WithSysFSMount(po.fs, po.guest)
	}
	mc := wazero.NewModuleConfig().WithName("").WithArgs(argv(m, cfg.Args)...).
		WithStdin(stdinReader(runCtx, opts.Stdin)).
		WithStdout(sink.stream(0, opts.Stdout)).WithStderr(sink.stream(1, opts.Stderr)).
		WithSysWalltime().WithSysNanotime().WithRandSource(randReader{}).
		WithNanosleep(func(ns int64) { sleepCtx(runCtx, time.Duration(ns)) }).
		WithOsyield(goruntime.Gosched).WithFSConfig(fsc)
	for _, kv := range env(p) {
		k, v, _ := strings.Cut(kv, "=")
		mc = mc.WithEnv(k, v)
	}

	// A run's CPU time is its thread's, so its goroutine keeps one thread.
	// A kernel's run (one with a Bridge) is not measured (CPUMS 0; its
	// process's CPU time is its sandbox's): it waits in host calls between
	// cells, and a locked thread made every wake-up a hand-off between
	// threads.
	account := bridgeOf(ctx) == nil
	var cpu0, cpu time.Duration
	if account {
		goruntime.LockOSThread()
		cpu0 = threadCPU()
	}
	inst, ierr := instantiate(experimental.WithMemoryAllocator(runCtx, mem), e.rt, compiled, mc)
	if account {
		cpu = threadCPU() - cpu0
		goruntime.UnlockOSThread()
	}
	if inst != nil {
		_ = inst.Close(ctx)
	}

	res := &native.Result{Enforced: enforced(p, pre, limit), Wall: time.Since(start)}
	res.WallMS = float64(res.Wall.Microseconds()) / 1000
	res.CPUMS = float64(cpu.Microseconds()) / 1000
	res.PeakMemoryBytes = int64(mem.peak.Load())
	var exit *sys.ExitError
	cause := context.Cause(runCtx)
	switch {
	case errors.Is(cause, errTimeout):
		res.Status, res.ExitCode, res.Signal = native.StatusTimeout, exitKilled, "killed"
	case errors.Is(cause, errOutputLimit):
		res.Status, res.ExitCode, res.Signal = native.StatusOutputLimit, exitKilled, "killed"
	case ctx.Err() != nil:
		res.Status, res.ExitCode, res.Signal = native.StatusKilled, exitKilled, "killed"
	case ierr == nil:
		res.Status = native.StatusOK
	case errors.As(ierr, &exit):
		res.ExitCode = int(exit.ExitCode())
		res.Status = native.StatusOK
		if res.ExitCode != 0 {
			res.Status = native.StatusNonzeroExit
		}
	case errors.Is(ierr, ErrModule):
		res.Status, res.ExitCode, res.Error = native.StatusSetupError, 126, ierr.Error()
	default:
		// A trap (unreachable, out-of-bounds access, stack overflow): the
		// wasm equivalent of a fatal signal.
		res.Status, res.ExitCode, res.Signal = native.StatusNonzeroExit, 128+6, "trap"
		res.Error = "wasm trap: " + firstLine(ierr.Error())
		sink.stream(1, opts.Stderr).Write([]byte("airlock: " + res.Error + "\n"))
	}
	if mem.refused.Load() && res.Status != native.StatusOK && res.Status != native.StatusSetupError {
		res.Status = native.StatusOOM
	}
	res.Stdout, res.Stderr = sink.bufs[0].String(), sink.bufs[1].String()
	res.Truncated = sink.over
	return res, nil
}

// instantiate runs the module's _start. wazero panics if an allocator
// cannot provide a module's initial memory; that is reported, not fatal.
func instantiate(ctx context.Context, rt wazero.Runtime, c wazero.CompiledModule, mc wazero.ModuleConfig) (inst interface{ Close(context.Context) error }, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: instantiating: %v", ErrModule, r)
		}
	}()
	m, err := rt.InstantiateModule(ctx, c, mc)
	if m == nil {
		return nil, linkError(err)
	}
	return m, err
}

// linkError marks instantiation failures that are not the program's own
// exit (a missing import, say) as module errors.
func linkError(err error) error {
	var exit *sys.ExitError
	if err == nil || errors.As(err, &exit) || !strings.Contains(err.Error(), "import") {
		return err
	}
	return fmt.Errorf("%w: %v (the wasm tier provides WASI preview 1 only)", ErrModule, err)
}

func exportedMemories(c wazero.CompiledModule) []api.MemoryDefinition {
	var out []api.MemoryDefinition
	for _, d := range c.ExportedMemories() {
		out = append(out, d)
	}
	return out
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// argv is the guest's argv: the module's name, then cfg.Args[1:].
func argv(m Module, args []string) []string {
	out := []string{m.Name}
	if len(args) > 1 {
		out = append(out, args[1:]...)
	}
	return out
}

// env is the policy's environment, plus PWD (the working directory of
// WASI programs, which have no chdir) unless the policy sets it.
func env(p *policy.Policy) []string {
	out := append([]string(nil), p.Env...)
	for _, kv := range out {
		if strings.HasPrefix(kv, "PWD=") {
			return out
		}
	}
	return append(out, "PWD="+p.Filesystem.Workdir)
}

// memoryLimit is the policy's memory limit as linear memory bytes: whole
// 64 KiB pages, at most 4 GiB (wasm32).
func memoryLimit(b int64) uint64 {
	const maxBytes = 1 << 32
	if b <= 0 || b > maxBytes {
		return maxBytes
	}
	return uint64(b) &^ (1<<16 - 1)
}

// memAllocator backs each linear memory of one run, refusing to grow past
// the limit and remembering that it did.
type memAllocator struct {
	limit   uint64
	refused atomic.Bool
	peak    atomic.Uint64
}

// Allocate implements experimental.MemoryAllocator.
func (a *memAllocator) Allocate(capacity, _ uint64) experimental.LinearMemory {
	return &linearMemory{a: a, buf: make([]byte, 0, min(capacity, a.limit))}
}

type linearMemory struct {
	a   *memAllocator
	buf []byte
}

// Reallocate implements experimental.LinearMemory.
func (l *linearMemory) Reallocate(size uint64) []byte {
	if size > l.a.limit {
		l.a.refused.Store(true)
		return nil
	}
	if size > uint64(cap(l.buf)) {
		nb := make([]byte, size, min(max(size, 2*uint64(cap(l.buf))), l.a.limit))
		copy(nb, l.buf)
		l.buf = nb
	} else {
		l.buf = l.buf[:size]
	}
	if size > l.a.peak.Load() {
		l.a.peak.Store(size)
	}
	return l.buf
}

// Free implements experimental.LinearMemory.
func (l *linearMemory) Free() { l.buf = nil }

// sink counts a run's stdout and stderr against the output limit, keeps
// a capped copy, and stops the run when the limit is passed.
type sink struct {
	mu      sync.Mutex
	total   int64
	limit   int64
	over    bool
	onOver  func()
	capture bool
	bufs    [2]bytes.Buffer
}

type streamWriter struct {
	s      *sink
	stream int
	w      io.Writer
}

func (s *sink) stream(i int, w io.Writer) io.Writer { return &streamWriter{s, i, w} }

// Write never fails: output past the limit is dropped and the run stopped.
func (w *streamWriter) Write(p []byte) (int, error) {
	s := w.s
	s.mu.Lock()
	n := min(int64(len(p)), max(s.limit-s.total, 0))
	s.total += int64(len(p))
	if s.capture && n > 0 {
		s.bufs[w.stream].Write(p[:n])
	}
	first := !s.over && s.total > s.limit
	s.over = s.over || first
	s.mu.Unlock()
	if w.w != nil && n > 0 {
		_, _ = w.w.Write(p[:n])
	}
	if first {
		s.onOver()
	}
	return len(p), nil
}

// stdinReader gives the guest r (nothing when nil), and ends a read that
// is still blocked when the run ends.
func stdinReader(ctx context.Context, r io.Reader) io.Reader {
	if r == nil {
		return bytes.NewReader(nil)
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := io.Copy(pw, r)
		pw.CloseWithError(err)
	}()
	context.AfterFunc(ctx, func() { pr.CloseWithError(context.Cause(ctx)) })
	return pr
}

// sleepCtx is the guest's nanosleep: it ends early when the run ends, so
// that a sleeping module is stopped at the deadline.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// randReader is the guest's random_get: the kernel's getrandom.
type randReader struct{}

func (randReader) Read(b []byte) (int, error) { return unix.Getrandom(b, 0) }

func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// preopen is one directory the guest sees.
type preopen struct {
	guest, host string
	writable    bool
	temp        bool
	fs          *rootFS
}

// preopens builds the guest's directories: /workspace (the policy's
// workspace or a fresh directory), /tmp (fresh) and the mounts.
func preopens(p *policy.Policy) ([]preopen, func(), error) {
	var out []preopen
	cleanup := func() {
		for _, po := range out {
			if po.fs != nil {
				po.fs.close()
			}
			if po.temp {
				_ = os.RemoveAll(po.host)
			}
		}
	}
	add := func(guest, host string, writable, temp bool) error {
		if host == "" {
			d, err := os.MkdirTemp("", "airlock-wasm-")
			if err != nil {
				return fmt.Errorf("wasm: %s: %w", guest, err)
			}
			host, temp = d, true
		}
		po := preopen{guest: guest, host: host, writable: writable, temp: temp}
		out = append(out, po)
		fi, err := os.Stat(host)
		if err != nil {
			return fmt.Errorf("wasm: %s: %w", guest, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("wasm: mount %s -> %s: the wasm tier preopens directories only, and %s is not one", host, guest, host)
		}
		fs, err := newRootFS(host, !writable)
		if err != nil {
			return fmt.Errorf("wasm: %s: %w", guest, err)
		}
		if writable {
			l := p.Limits
			fs.q = &quota{maxBytes: l.DiskBytes, maxIno: l.Inodes, maxFile: l.FileSizeBytes}
		}
		out[len(out)-1].fs = fs
		return nil
	}
	err := add("/workspace", p.Filesystem.Workspace, true, false)
	if err == nil {
		err = add("/tmp", "", true, false)
	}
	for _, m := range p.Filesystem.Mounts {
		if err != nil {
			break
		}
		err = add(m.Target, m.Source, m.Writable, false)
	}
	if err != nil {
		cleanup()
		return nil, func() {}, err
	}
	return out, cleanup, nil
}

// enforced describes what the module was given: this tier has no kernel
// boundary, so the layers are the capabilities handed to it and the
// limits the host enforces, and the policy knobs it cannot enforce are
// listed as missing.
func enforced(p *policy.Policy, pre []preopen, limit uint64) runtime.Enforced {
	var dirs []string
	for _, po := range pre {
		mode := "ro"
		if po.writable {
			mode = "rw"
		}
		src := po.host
		if po.temp {
			src = "fresh host directory"
		}
		dirs = append(dirs, fmt.Sprintf("%s (%s, %s)", po.guest, mode, src))
	}
	sort.Strings(dirs[2:])
	l := p.Limits
	cpu := runtime.Layer{Name: "cpu", State: runtime.StateOK, Detail: "one host thread at most; cpu_time bounded by the wall-time deadline"}
	if l.CPUs < 1 || l.CPUTime < l.WallTime {
		cpu.State, cpu.Detail = runtime.StateMissing, fmt.Sprintf("not enforced: the module runs on one host thread (cpus %g, cpu_time %s asked; only the %s wall-time deadline applies)", l.CPUs, l.CPUTime, l.WallTime)
	}
	return runtime.Enforced{
		{Name: "wasm", State: runtime.StateOK, Detail: "wazero " + WazeroVersion + " compiler, WASI preview 1 only; no kernel boundary: the module runs inside the airlock process and reaches the host only through these host functions"},
		{Name: "filesystem", State: runtime.StateOK, Detail: "preopened directories, resolved beneath each on the host (os.Root; symlink creation refused): " + strings.Join(dirs, ", ")},
		{Name: "network", State: runtime.StateOK, Detail: "none: no sockets are preopened and WASI preview 1 cannot create one"},
		{Name: "processes", State: runtime.StateOK, Detail: "none: WASI preview 1 cannot create processes or threads"},
		{Name: "env", State: runtime.StateOK, Detail: fmt.Sprintf("the policy's %d variables, plus PWD", len(p.Env))},
		{Name: "memory", State: runtime.StateOK, Detail: fmt.Sprintf("linear memory at most %d pages (%d bytes); host memory used by the runtime itself is not counted", limit>>16, limit)},
		{Name: "wall_time", State: runtime.StateOK, Detail: l.WallTime.String() + " deadline; guest loops and sleeps are stopped"},
		{Name: "output", State: runtime.StateOK, Detail: fmt.Sprintf("%d bytes of stdout+stderr", l.OutputBytes)},
		cpu,
		{Name: "disk", State: runtime.StateOK, Detail: fmt.Sprintf("each writable directory: at most %d bytes and %d files or directories added by the run, files at most %d bytes (what a host directory held before is not counted; past the limit a write fails with EIO)", l.DiskBytes, l.Inodes, l.FileSizeBytes)},
	}
}
