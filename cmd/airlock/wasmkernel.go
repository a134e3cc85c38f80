package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/airlock-dev/airlock/runtime/wasm"
)

func init() { hidden["wasm-kernel"] = cmdWasmKernel }

// cmdWasmKernel is the JavaScript kernel process of a code context in a
// wasm sandbox, started by the in-sandbox agent through package interp:
// `airlock wasm-kernel --memory N`. It runs QuickJS for WASI on wazero
// (wasm.ServeKernel) on the kernel pipes interp hands it, with its linear
// memory capped at N (the sandbox's memory limit).
func cmdWasmKernel(args []string) int {
	fs := flag.NewFlagSet("wasm-kernel", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	memory := fs.Int64("memory", 0, "linear memory limit in bytes")
	module := fs.String("module", wasm.QuickJSModule, "the QuickJS module")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "airlock wasm-kernel: usage: airlock wasm-kernel [--memory BYTES] [--module PATH]")
		return exitUsage
	}
	return wasm.ServeKernel(context.Background(), *module, *memory)
}
