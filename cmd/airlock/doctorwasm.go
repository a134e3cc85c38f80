package main

import (
	"context"
	"fmt"
	"os"

	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/wasm"
)

// doctorWasm reports whether the wasm tier (--runtime wasm) works by
// running a hello-world WASI module in-process, and says what the tier is:
// no kernel boundary, only the capabilities handed to the module.
func doctorWasm(p policy.Policy) rt.Layer {
	p.Runtime = policy.RuntimeWasm
	e, err := wasm.NewEngine(context.Background(), "")
	if err != nil {
		return rt.Layer{Name: "wasm", State: rt.StateMissing, Detail: "--runtime wasm unavailable: " + oneLine(err)}
	}
	defer e.Close()
	res, err := e.Run(context.Background(), wasm.Module{Name: "hello.wasm", Bytes: wasm.HelloModule()}, native.Config{Policy: p}, native.RunOptions{Capture: true})
	if err == nil && (res.Status != native.StatusOK || res.Stdout != wasm.HelloOutput) {
		err = fmt.Errorf("hello module ended %s with output %q: %s", res.Status, res.Stdout, res.Error)
	}
	if err != nil {
		return rt.Layer{Name: "wasm", State: rt.StateMissing, Detail: "--runtime wasm cannot run a module: " + oneLine(err)}
	}
	detail := fmt.Sprintf("wazero %s, WASI preview 1: ran a hello-world module in %.2f ms (compiling it included); no kernel boundary: a module gets only its args, env, stdio, clocks, random and preopened directories (no sockets, no processes)", wasm.WazeroVersion, res.WallMS)
	if _, err := os.Stat(wasm.QuickJSModule); err != nil {
		// The tier runs modules; its JavaScript code contexts cannot start.
		return rt.Layer{Name: "wasm", State: rt.StateDegraded, Detail: detail + "; JavaScript code contexts unavailable: " + wasm.ErrNoQuickJS.Error() + ": " + oneLine(err)}
	}
	return rt.Layer{Name: "wasm", State: rt.StateOK, Detail: detail + "; JavaScript code contexts: QuickJS 2021-03-27 for WASI at " + wasm.QuickJSModule}
}
