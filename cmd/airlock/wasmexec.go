package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/wasm"
)

func init() { hidden["wasm-exec"] = cmdWasmExec }

// cmdWasmExec is what an exec in an API sandbox with runtime wasm runs,
// inside that (native) sandbox: `airlock wasm-exec --memory N -- MODULE
// ARGS`. The module is a file in the sandbox; it gets exactly this
// process's environment (the sandbox's policy plus the exec's own), stdio,
// /workspace and a fresh /tmp, and its linear memory is capped at N. The
// exec's timeout and output cap are the server's; the sandbox's native
// layers stay around it all. There is no disk compilation cache here: the
// sandbox's files are the caller's to write, and the cache holds machine
// code that would be mapped executable.
func cmdWasmExec(args []string) int {
	fs := flag.NewFlagSet("wasm-exec", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	memory := fs.Int64("memory", 0, "linear memory limit in bytes")
	if err := fs.Parse(args); err != nil || fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "airlock wasm-exec: usage: airlock wasm-exec [--memory BYTES] -- MODULE.wasm [ARGS...]")
		return exitUsage
	}
	p, err := policy.Preset(policy.Strict)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock wasm-exec: %v\n", err)
		return exitSetup
	}
	p.Runtime = policy.RuntimeWasm
	p.Env = os.Environ()
	p.Filesystem.Workspace = "/workspace"
	if wd, err := os.Getwd(); err == nil {
		p.Filesystem.Workdir = wd
	}
	if *memory > 0 {
		p.Limits.MemoryBytes = *memory
	}
	// The exec's own timeout and output cap apply from outside.
	p.Limits.WallTime, p.Limits.CPUTime, p.Limits.OutputBytes = 365*24*time.Hour, 365*24*time.Hour, 1<<62
	m, err := wasm.ReadModule(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: %v\n", err)
		return 127
	}
	m.Name = fs.Arg(0)
	e, err := wasm.NewEngine(context.Background(), "")
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: %v\n", err)
		return exitSetup
	}
	defer e.Close()
	res, err := e.Run(context.Background(), m, native.Config{Policy: p, Args: fs.Args()},
		native.RunOptions{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: %v\n", err)
		return exitCodeFor(res)
	}
	if res.Status == native.StatusOOM {
		fmt.Fprintf(os.Stderr, "airlock: oom: the module's memory reached the %d-byte limit\n", p.Limits.MemoryBytes)
	}
	return res.ExitCode
}
