// Package wasm is airlock's WebAssembly tier: a WASI preview 1 module run
// by wazero (pure Go, no CGO) inside the airlock process, from the same
// policy.Policy as the other tiers.
//
// There is no kernel boundary here: the module can touch only what the
// host functions hand it. It gets its arguments, exactly the policy's
// environment (plus PWD, which WASI programs use as their working
// directory), stdin/stdout/stderr with the policy's output cap, the host's
// clocks and random source, and preopened directories: /workspace, /tmp
// and the policy's mounts (read-only unless the mount says rw). It gets no
// sockets, no processes and no other host functions. Its linear memory is
// capped at the policy's memory limit, a wall-clock deadline stops guest
// loops and sleeps, and the statuses are native's (timeout, oom,
// output_limit, nonzero_exit, killed).
//
// Preopened directories are served through os.Root, so a path that
// resolves outside the directory (by "..", an absolute symlink or a
// relative one) is refused by the host, not only by wazero's path checks.
//
// Compiled modules are cached twice: in memory per Engine (keyed by the
// module's SHA-256), and on disk by wazero's compilation cache.
package wasm

import "errors"

// WazeroVersion is the wazero release this tier is built and tested with.
const WazeroVersion = "v1.12.0"

// ErrModule is wrapped by errors about the module itself (unreadable, not
// WebAssembly, importing something other than WASI preview 1).
var ErrModule = errors.New("wasm module")

// MaxModuleBytes bounds the size of a module file.
const MaxModuleBytes = 256 << 20
