// Package interp runs stateful code-interpreter kernels: persistent Python,
// JavaScript and bash processes that execute cells one at a time and keep
// their variables, imports, functions and working directory between cells.
//
// It is meant to run inside a sandbox, in the in-sandbox agent, but has no
// dependency on one: a Kernel is a plain child process.
//
// # Kernels
//
// The kernel programs are embedded in this package. Each runs in its own
// process group with:
//
//   - fd 0: /dev/null, so user code reading stdin gets EOF (bash reads its
//     commands on fd 0 and runs each cell with stdin from /dev/null);
//   - fds 1 and 2: the user's stdout and stderr, pipes the Go side streams;
//   - fd 3: cell requests (JSON lines; bash gets shell lines on fd 0);
//   - fd 4: messages to the Go side, JSON lines: ready, result (a MIME bundle),
//     error {name, value, traceback}, end;
//   - fds 5 and 6: duplicates of fds 1 and 2 on which the kernel writes a sync
//     marker ("\x00airlock-sync:" + a per-cell token + "\x00") before sending
//     messages. Every message says how many markers precede it on each stream,
//     and the Go side holds it back until it has read that far, so results,
//     errors and the end of a cell are ordered after the output printed before
//     them. Markers are removed from the output.
//
// Python is python3 -u with the kernel passed through fd 3. The last
// statement of a cell, if an expression, is evaluated separately (as in
// IPython) and its value returned as text/plain plus rich representations
// (_repr_html_, _repr_svg_, _repr_png_, _repr_markdown_, _repr_json_,
// _repr_mimebundle_ ...; DataFrames also as application/json in "split"
// orientation). matplotlib uses the Agg backend; every figure shown with
// plt.show() or left open at the end of a cell is returned as image/png and
// closed. display(obj) sends a result at once. Top-level await works. For
// notebooks written for Jupyter, a cell that does not parse as Python has
// its IPython shell escapes (!command) and the line magics %pip, %cd, %pwd,
// %env and %matplotlib (a no-op) run; other magics raise NameError.
//
// The result holding the value of the last expression is marked
// (Output.Main, ExecResult.MainResult): it is what a notebook shows as
// Out[n], as opposed to figures and display() calls.
//
// JavaScript is node with one persistent vm context. Top-level await is
// supported through node's REPL rewrite, which keeps let/const/var/function/
// class declarations persistent (const becomes let, as in the REPL). The last
// expression's value is returned as text/plain (util.inspect). The context's
// built-in objects are its own (as in node's REPL with useGlobal false), so
// `x instanceof Array` is false for arrays made by node's modules;
// Array.isArray and the like work.
//
// Bash is an interactive bash (so that ^C aborts the whole command and the
// shell keeps going) reading its commands on fd 0. A cell that ends with a
// non-zero status reports an ExitStatus error.
//
// # Interrupts, timeouts and crashes
//
// Interrupt, a timeout or the cancellation of Execute's context stop the
// running cell with a KeyboardInterrupt error (TimeoutError for a timeout) and
// keep the kernel and its state. Python gets SIGINT, which raises
// KeyboardInterrupt; bash's process group gets SIGINT, as from a terminal.
// If the cell has not ended KillAfter/2 later, every process in the kernel's
// group gets SIGINT (bash instead gets a nudge on its command pipe), and at
// KillAfter the kernel is killed: the error says that the state is lost.
//
// node gets no signals: its breakOnSigint is not safe against signals from
// outside (one that lands as a run ends aborts the next run, and between
// runs SIGINT ends the process). The synchronous part of a JavaScript cell
// runs under vm's timeout option, so a timeout stops `while (true) {}` and
// keeps the state, and a cell that awaits ends at once on Interrupt (what it
// started keeps running in the background). But Interrupt or cancellation
// cannot stop synchronous JavaScript, nor can anything stop code spinning in
// a callback after an await: those cells end with the kernel killed at
// KillAfter.
//
// A kernel that dies (os._exit, a segfault, exit in bash, an OOM kill) ends
// the running cell with a KernelDied error; the next cell starts a fresh
// kernel and its result has Restarted set.
package interp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-dev/airlock/interp/lang"
)

// Language is a kernel language.
type Language string

// The kernel languages.
const (
	Python     Language = lang.Python
	JavaScript Language = lang.JavaScript
	// TypeScript runs in a JavaScript kernel: each cell is transpiled to
	// JavaScript first (esbuild, types stripped, not checked).
	TypeScript Language = lang.TypeScript
	Bash       Language = lang.Bash
)

// Defaults for Config and Execute.
const (
	DefaultPython    = "/usr/bin/python3"
	DefaultNode      = "/usr/bin/node"
	DefaultBash      = "/bin/bash"
	DefaultKillAfter = 5 * time.Second
	// DefaultMaxResult bounds one rich result, and the results of one cell
	// together, in bytes.
	DefaultMaxResult = 32 << 20
	// DefaultMaxOutput is the output cap Execute uses when given 0.
	DefaultMaxOutput = 1 << 20
)

// Config describes a kernel.
type Config struct {
	// Language is python, javascript or bash.
	Language Language
	// Cwd is the kernel's initial working directory; empty means ours.
	Cwd string
	// Env is the kernel's environment; nil means ours. Python kernels also
	// get PYTHONUNBUFFERED=1, PYTHONIOENCODING=utf-8 and MPLBACKEND=Agg.
	Env []string
	// Python, Node and Bash are interpreter paths; empty means
	// DefaultPython, DefaultNode and DefaultBash.
	Python, Node, Bash string
	// QuickJS, if set, is the command that runs JavaScript (and TypeScript)
	// kernels instead of node: the wasm tier's QuickJS on wazero
	// (`airlock wasm-kernel`), which runs kernels/quickjs.js.
	QuickJS []string
	// KillAfter is how long after the first interrupt a kernel that has
	// not stopped the cell is killed (losing its state); 0 means
	// DefaultKillAfter.
	KillAfter time.Duration
	// MaxResult bounds one result and all results of a cell, in bytes;
	// larger results are dropped and the cell marked Truncated. 0 means
	// DefaultMaxResult.
	MaxResult int
	// Credential is the kernel process's user; nil means ours.
	Credential *syscall.Credential
	// AmbientCaps are the kernel process's ambient capabilities (a root
	// workload's); nil means none.
	AmbientCaps []uintptr
	// SysProcAttr, if set, completes the kernel process's attributes
	// (the gvisor runtime's workload cgroup: see agent.workloadGroup).
	SysProcAttr func(*syscall.SysProcAttr) *syscall.SysProcAttr
	// Spawn, if set, runs start (which forks the kernel) on a thread of its
	// choosing, e.g. one in the workload's cgroup; nil runs it in place.
	Spawn func(start func() error) error
}

// Output is one piece of a cell's output, in the order it was produced.
type Output struct {
	// Type is "stdout", "stderr", "result" or "error".
	Type string
	// Text is the text of stdout and stderr, and the text/plain of a
	// result.
	Text string
	// Data is a result's MIME bundle. Binary types (image/png, image/jpeg)
	// are base64; JSON types hold JSON text.
	Data map[string]string
	// Error is set for "error".
	Error *ExecError
	// Main marks the result that is the value of the cell's last
	// expression (what a notebook shows as Out[n]), as opposed to figures
	// and display() calls.
	Main bool
}

// ExecError is the error that ended a cell.
type ExecError struct {
	// Name is the exception's class (ZeroDivisionError, ReferenceError),
	// KeyboardInterrupt for an interrupt, TimeoutError for a timeout,
	// KernelDied for a crash, ExitStatus for a bash cell's non-zero status.
	Name string
	// Value is the exception's message.
	Value string
	// Traceback holds the lines of the traceback, kernel frames removed.
	Traceback []string
}

// Error implements error.
func (e *ExecError) Error() string {
	if e.Value == "" {
		return e.Name
	}
	return e.Name + ": " + e.Value
}

// ExecResult is the outcome of a cell.
type ExecResult struct {
	// ExecutionCount numbers the cells run by the current kernel process,
	// from 1; it starts again after a restart.
	ExecutionCount int
	// Results are the MIME bundles, in order: figures shown, display()
	// calls, the value of the last expression, figures left open.
	Results []map[string]string
	// MainResult is the index in Results of the value of the cell's last
	// expression, or -1 if there is none (a statement, None, undefined, an
	// error, or a result dropped for its size).
	MainResult int
	// Stdout and Stderr are the cell's output, up to the cap.
	Stdout, Stderr string
	// Error is why the cell failed, or nil.
	Error *ExecError
	// Truncated is set when output beyond the cap, or a result beyond
	// MaxResult, was dropped.
	Truncated bool
	// Restarted is set when the previous kernel process died (or was
	// killed after an interrupt) and this cell ran in a fresh one.
	Restarted bool
}

// ExecuteOptions are the parameters of ExecuteWith.
type ExecuteOptions struct {
	// Timeout bounds the cell, counted from when the kernel gets it; 0
	// means none.
	Timeout time.Duration
	// MaxOutput caps stdout plus stderr in bytes; 0 means
	// DefaultMaxOutput.
	MaxOutput int
	// Env sets environment variables for this cell only: while it runs
	// the kernel's environment (os.environ, process.env, the shell's
	// exported variables) and so the processes it starts have them, and
	// afterwards the previous values are back. Assignments the cell itself
	// makes to these variables do not outlive it. Names must not be empty
	// or contain '=' (for bash, they must be shell identifiers); names
	// and values must not contain NUL bytes.
	Env map[string]string
}

// ErrClosed is returned by a Kernel's methods after Close.
var ErrClosed = errors.New("interp: kernel closed")

// Kernel is a running kernel. Cells run one at a time: Execute waits for the
// running cell to finish. Its methods are safe for concurrent use.
type Kernel struct {
	cfg Config

	sem  chan struct{} // held while a cell runs or the kernel restarts
	intr chan struct{} // Interrupt's requests to the running cell

	mu      sync.Mutex
	p       *proc // nil after Close, or while being replaced
	closed  bool
	died    bool // the last process died on its own: tell the next cell
	count   int  // cells run by p
	running bool // a cell is executing
}

// Start starts a kernel and waits until it is ready. ctx bounds the start
// only.
func Start(ctx context.Context, cfg Config) (*Kernel, error) {
	switch cfg.Language {
	case Python, JavaScript, TypeScript, Bash:
	default:
		return nil, fmt.Errorf("interp: unknown language %q", cfg.Language)
	}
	if cfg.Python == "" {
		cfg.Python = DefaultPython
	}
	if cfg.Node == "" {
		cfg.Node = DefaultNode
	}
	if cfg.Bash == "" {
		cfg.Bash = DefaultBash
	}
	if cfg.KillAfter <= 0 {
		cfg.KillAfter = DefaultKillAfter
	}
	if cfg.MaxResult <= 0 {
		cfg.MaxResult = DefaultMaxResult
	}
	k := &Kernel{cfg: cfg, sem: make(chan struct{}, 1), intr: make(chan struct{}, 1)}
	p, err := k.spawn(ctx)
	if err != nil {
		return nil, err
	}
	k.p = p
	return k, nil
}

// Language returns the kernel's language.
func (k *Kernel) Language() Language { return k.cfg.Language }

// spawn starts a kernel process and waits for its ready message.
func (k *Kernel) spawn(ctx context.Context) (*proc, error) {
	token := newToken()
	p, err := startProc(&k.cfg, token)
	if err != nil {
		return nil, err
	}
	c := &cell{k: k, p: p, token: token, startup: true, res: &ExecResult{}}
	if err := c.run(ctx, 0); err != nil {
		p.kill(killClose, "")
		<-p.exited
		p.close()
		return nil, err
	}
	return p, nil
}

// Execute runs one cell and returns its outcome. emit, if not nil, receives
// the outputs as they come, from the calling goroutine's point of view
// sequentially. Failures of the cell (exceptions, interrupts, timeouts, a
// crash) are in the result's Error; Execute's error is for the kernel itself
// (closed, cannot start) and for ctx, in which case the partial result is
// returned too.
//
// timeout (0: none) is counted from when the kernel gets the cell. maxOutput
// (0: DefaultMaxOutput) caps stdout plus stderr in bytes: beyond it output is
// read and dropped, Truncated is set and the cell keeps running (its
// timeout still applies), so memory stays bounded whatever it prints.
//
// If ctx ends while the cell runs, the cell is interrupted as by Interrupt;
// Execute returns once it has stopped, which KillAfter bounds.
func (k *Kernel) Execute(ctx context.Context, code string, timeout time.Duration, maxOutput int, emit func(Output)) (*ExecResult, error) {
	return k.ExecuteWith(ctx, code, ExecuteOptions{Timeout: timeout, MaxOutput: maxOutput}, emit)
}

// ExecuteWith is Execute with options: a timeout, an output cap and
// environment variables for the cell.
func (k *Kernel) ExecuteWith(ctx context.Context, code string, opts ExecuteOptions, emit func(Output)) (*ExecResult, error) {
	timeout, maxOutput := opts.Timeout, opts.MaxOutput
	if maxOutput <= 0 {
		maxOutput = DefaultMaxOutput
	}
	if err := checkEnv(k.cfg.Language, opts.Env); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-k.sem }()

	res := &ExecResult{MainResult: -1}
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil, ErrClosed
	}
	p := k.p
	k.mu.Unlock()
	if p == nil || p.isDead() {
		diedIdle := p != nil // died between cells
		if p != nil {
			p.kill(killNone, "")
			p.close()
		}
		np, err := k.spawn(ctx)
		if err != nil {
			return nil, fmt.Errorf("interp: restarting the kernel: %w", err)
		}
		k.mu.Lock()
		if k.closed {
			k.mu.Unlock()
			np.kill(killClose, "")
			np.close()
			return nil, ErrClosed
		}
		k.p, p = np, np
		k.count = 0
		res.Restarted = k.died || diedIdle
		k.died = false
		k.mu.Unlock()
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	k.mu.Lock()
	k.count++
	res.ExecutionCount = k.count
	k.running = true
	k.mu.Unlock()
	select {
	case <-k.intr: // a stale request from before this cell
	default:
	}
	defer func() {
		k.mu.Lock()
		k.running = false
		k.mu.Unlock()
	}()

	if k.cfg.Language == TypeScript {
		code = transpileTS(code)
	}
	token := newToken()
	req, err := encodeRequest(k.cfg.Language, res.ExecutionCount, code, token, k.cfg.MaxResult, timeout, opts.Env)
	if err != nil {
		return nil, err
	}
	c := &cell{
		k: k, p: p, token: token, n: res.ExecutionCount, emit: emit,
		maxOutput: maxOutput, resBudget: k.cfg.MaxResult, res: res, timeout: timeout,
	}
	go p.write(req)
	err = c.run(ctx, timeout)
	if c.died {
		k.mu.Lock()
		if k.p == p {
			// It died on its own, or we killed it after an interrupt.
			k.p = nil
			k.died = true
		}
		k.mu.Unlock()
		p.close()
	}
	return res, err
}

// Interrupt interrupts the running cell, if any, as a timeout would: the
// cell ends with KeyboardInterrupt, or the kernel is killed KillAfter later.
func (k *Kernel) Interrupt() error {
	k.mu.Lock()
	closed, running := k.closed, k.running
	k.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if running {
		select {
		case k.intr <- struct{}{}:
		default:
		}
	}
	return nil
}

// Restart replaces the kernel process with a fresh one, losing all state. A
// running cell ends with a KernelRestarted error. ctx bounds the wait for the
// new kernel.
func (k *Kernel) Restart(ctx context.Context) error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return ErrClosed
	}
	old := k.p
	k.p = nil
	k.mu.Unlock()
	if old != nil {
		old.kill(killRestart, "")
	}
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-k.sem }()
	if old != nil {
		<-old.exited
		old.close()
	}
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return ErrClosed
	}
	if k.p != nil { // a cell queued behind us started one already
		k.mu.Unlock()
		return nil
	}
	k.mu.Unlock()
	p, err := k.spawn(ctx)
	if err != nil {
		return fmt.Errorf("interp: restarting the kernel: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		p.kill(killClose, "")
		p.close()
		return ErrClosed
	}
	k.p = p
	k.count = 0
	k.died = false
	return nil
}

// Close kills the kernel and its process group and waits for the kernel to
// exit. A running cell ends with a KernelDied error and Execute returns
// ErrClosed.
func (k *Kernel) Close() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil
	}
	k.closed = true
	p := k.p
	k.p = nil
	k.mu.Unlock()
	if p != nil {
		p.kill(killClose, "")
		<-p.exited
		p.close()
	}
	return nil
}
