package wasm

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// maxCompiled is how many compiled modules an Engine keeps in memory.
const maxCompiled = 32

// Engine runs modules. It holds one wazero runtime (with WASI preview 1
// instantiated once), the compiled modules it has seen, and, when it has
// one, the on-disk compilation cache. It is safe for concurrent use; each
// run gets its own module instance, memory and preopens.
type Engine struct {
	rt       wazero.Runtime
	cache    wazero.CompilationCache
	cacheDir string

	// stop, when set, replaces wazero's context checks (see
	// WithoutContextChecks).
	stop func()

	mu       sync.Mutex
	compiled map[[32]byte]wazero.CompiledModule
	order    [][32]byte
}

// An EngineOption changes how an Engine compiles and runs modules.
type EngineOption func(*Engine)

// stopGrace is how long a run whose context has ended may go on before an
// engine without context checks calls its stop function: long enough for
// code that reaches a host call (which sees the end) to return by itself.
const stopGrace = 2 * time.Second

// WithoutContextChecks compiles modules without wazero's context checks
// (WithCloseOnContextDone), which call out of the module's code at every
// loop iteration so that a run whose context ends stops at once: QuickJS's
// bytecode interpreter is one loop, and those calls made it about ten times
// slower (docs/wasm.md). Without them, module code cannot be stopped inside
// the process: when a run's context ends (wall-time limit, output limit,
// cancellation) and the run has not returned stopGrace later, the engine
// calls stop, which must end the code by other means and not return (the
// QuickJS kernel, alone in its process, exits). A kernel waiting in the
// bridge's poll sees the end and returns by itself.
func WithoutContextChecks(stop func()) EngineOption {
	return func(e *Engine) { e.stop = stop }
}

// DefaultCacheDir is where `airlock run --runtime wasm` keeps compiled
// modules: $AIRLOCK_WASM_CACHE if set, else $XDG_CACHE_HOME/airlock/wasm
// (~/.cache/airlock/wasm).
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("AIRLOCK_WASM_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("wasm compilation cache: %w", err)
	}
	return filepath.Join(d, "airlock", "wasm"), nil
}

// NewEngine starts an engine. cacheDir is the on-disk compilation cache
// (created 0700 if missing); empty means no disk cache. The cache holds
// machine code that is mapped executable, so a directory that is not
// owned by this user or that others can write is refused.
func NewEngine(ctx context.Context, cacheDir string, opts ...EngineOption) (*Engine, error) {
	e := &Engine{cacheDir: cacheDir, compiled: map[[32]byte]wazero.CompiledModule{}}
	for _, o := range opts {
		o(e)
	}
	// The compilation cache keys code by this flag too (wazero's module
	// ID), so engines with and without checks may share a cache directory.
	cfg := wazero.NewRuntimeConfigCompiler().WithCloseOnContextDone(e.stop == nil)
	if cacheDir != "" {
		if err := checkCacheDir(cacheDir); err != nil {
			return nil, err
		}
		c, err := wazero.NewCompilationCacheWithDir(cacheDir)
		if err != nil {
			return nil, fmt.Errorf("wasm compilation cache %s: %w", cacheDir, err)
		}
		e.cache = c
		cfg = cfg.WithCompilationCache(c)
	}
	e.rt = wazero.NewRuntimeWithConfig(ctx, cfg)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, e.rt); err != nil {
		e.Close()
		return nil, fmt.Errorf("wasm: instantiating WASI preview 1: %w", err)
	}
	if err := instantiateBridge(ctx, e.rt); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// checkCacheDir creates dir 0700 and refuses it unless it is a directory
// owned by this user that no one else can write.
func checkCacheDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("wasm compilation cache: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("wasm compilation cache: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("wasm compilation cache %s: not a directory", dir)
	case !ok || int(st.Uid) != os.Geteuid():
		return fmt.Errorf("wasm compilation cache %s: not owned by uid %d (it holds executable code; remove it, or set AIRLOCK_WASM_CACHE to another directory)", dir, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("wasm compilation cache %s: writable by others (mode %v; it holds executable code: chmod 700 it)", dir, fi.Mode().Perm())
	}
	return nil
}

// CacheDir is the engine's on-disk compilation cache ("" for none).
func (e *Engine) CacheDir() string { return e.cacheDir }

// Close releases the runtime, its compiled modules and the cache handle.
func (e *Engine) Close() {
	ctx := context.Background()
	_ = e.rt.Close(ctx)
	if e.cache != nil {
		_ = e.cache.Close(ctx)
	}
}

// compile returns the compiled module for bin, compiling it (or loading
// it from the disk cache) the first time.
func (e *Engine) compile(ctx context.Context, bin []byte) (wazero.CompiledModule, error) {
	key := sha256.Sum256(bin)
	e.mu.Lock()
	if m, ok := e.compiled[key]; ok {
		e.mu.Unlock()
		return m, nil
	}
	e.mu.Unlock()
	m, err := e.rt.CompileModule(ctx, bin)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrModule, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if old, ok := e.compiled[key]; ok {
		_ = m.Close(ctx)
		return old, nil
	}
	if len(e.order) >= maxCompiled {
		// Instances already running keep working after Close.
		_ = e.compiled[e.order[0]].Close(ctx)
		delete(e.compiled, e.order[0])
		e.order = e.order[1:]
	}
	e.compiled[key] = m
	e.order = append(e.order, key)
	return m, nil
}
