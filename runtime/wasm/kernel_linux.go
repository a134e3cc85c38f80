package wasm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// QuickJSModule is where scripts/setup.sh installs QuickJS built for WASI
// (scripts/quickjs/build.sh): the engine of the wasm tier's JavaScript code
// contexts. The host-derived root of a sandbox binds /usr read-only, so the
// module is at the same path inside.
const QuickJSModule = "/usr/local/lib/airlock/quickjs.wasm"

// ErrNoQuickJS is returned when the QuickJS module is not installed.
var ErrNoQuickJS = errors.New("the wasm tier's JavaScript needs QuickJS for WASI, built by scripts/setup.sh (scripts/quickjs/build.sh)")

// kernelMemoryMargin is what the QuickJS host keeps below the linear memory
// limit for itself (its stack and static data), so that a cell that
// allocates too much gets QuickJS's "out of memory" error, which keeps the
// context, rather than a failed memory.grow, which ends it.
const kernelMemoryMargin = 12 << 20

// kernelCacheDir is the compilation cache of kernel modules: in the
// sandbox's own /tmp, owned by the workload's user, so that a context after
// the first (or a restarted kernel) does not compile QuickJS again. The
// cache holds machine code the workload could rewrite; it runs as that same
// workload, inside the same native sandbox, whose own processes (a Python
// context's) are native code already, so this gives it nothing new.
// $AIRLOCK_WASM_CACHE overrides it.
func kernelCacheDir() string {
	if d := os.Getenv("AIRLOCK_WASM_CACHE"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "airlock-wasm-cache-"+strconv.Itoa(os.Getuid()))
}

// ServeKernel runs a code kernel module (QuickJS, at module) on the pipes
// package interp gives a kernel process: requests on fd 3, messages on fd 4,
// sync markers on fds 5 and 6, output on 1 and 2. memory caps its linear
// memory (0: the strict preset's). It returns the process's exit code and
// writes why it failed to stderr.
func ServeKernel(ctx context.Context, module string, memory int64) int {
	m, err := ReadModule(module)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: %s is missing", ErrNoQuickJS, module)
		}
		fmt.Fprintf(os.Stderr, "airlock: %v\n", err)
		return 127
	}
	files := map[int]io.Writer{1: os.Stdout, 2: os.Stderr}
	for _, fd := range []int{4, 5, 6} {
		files[fd] = os.NewFile(uintptr(fd), "kernel-"+strconv.Itoa(fd))
	}
	b := NewBridge(os.NewFile(3, "kernel-requests"), files)

	p, err := policy.Preset(policy.Strict)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: %v\n", err)
		return 70
	}
	p.Runtime = policy.RuntimeWasm
	p.Env = os.Environ()
	p.Filesystem.Workspace = "/workspace"
	if _, err := os.Stat("/workspace"); err != nil {
		p.Filesystem.Workspace = ""
	}
	if wd, err := os.Getwd(); err == nil {
		p.Filesystem.Workdir = wd
	}
	if memory > 0 {
		p.Limits.MemoryBytes = memory
	}
	// The kernel lives as long as its context; the cells' timeouts are the
	// kernel's own, and output is counted by package interp.
	p.Limits.WallTime, p.Limits.CPUTime, p.Limits.OutputBytes = 365*24*time.Hour, 365*24*time.Hour, 1<<62
	args := []string{module}
	if heap := p.Limits.MemoryBytes - kernelMemoryMargin; heap > 0 {
		args = append(args, "--memory-limit", strconv.FormatInt(heap, 10))
	}
	// QuickJS polls its own interrupt handler for the cells' timeouts and
	// interrupts, and interp kills this process when a cell stuck in a C
	// built-in does not stop: wazero's context checks only slowed every
	// cell down (WithoutContextChecks). Should the run's context end all
	// the same, the process exits.
	stop := WithoutContextChecks(func() {
		fmt.Fprintln(os.Stderr, "airlock: the QuickJS kernel did not stop at the end of its run: exiting")
		os.Exit(exitKilled)
	})
	e, err := NewEngine(ctx, kernelCacheDir(), stop)
	if err != nil {
		// A cache directory someone else made: compile without one.
		e, err = NewEngine(ctx, "", stop)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: %v\n", err)
		return 70
	}
	defer e.Close()
	res, err := e.Run(WithBridge(ctx, b), m, native.Config{Policy: p, Args: args},
		native.RunOptions{Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: the QuickJS kernel: %v\n", err)
		if res != nil {
			return res.ExitCode
		}
		return 70
	}
	if err := b.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "airlock: the QuickJS kernel's requests: %v\n", err)
	}
	if res.Status == native.StatusOOM {
		fmt.Fprintf(os.Stderr, "airlock: oom: the QuickJS kernel's memory reached the %d-byte limit\n", p.Limits.MemoryBytes)
	}
	return res.ExitCode
}
