package wasm

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/interp"
)

// kernelEnv, when set in a test binary's environment, makes it serve a
// QuickJS kernel (TestMain) with the module it names.
const kernelEnv = "AIRLOCK_TEST_QUICKJS_KERNEL"

// quickJS starts a JavaScript kernel on the installed QuickJS module, run by
// this test binary as the kernel process (the role `airlock wasm-kernel`
// plays in a wasm sandbox).
func quickJS(t testing.TB) *interp.Kernel {
	t.Helper()
	return startJS(t, true)
}

// startJS starts a JavaScript kernel: QuickJS in wazero, or node (the peer
// of the benchmarks).
func startJS(t testing.TB, quickjs bool) *interp.Kernel {
	t.Helper()
	if _, err := os.Stat(QuickJSModule); quickjs && err != nil {
		t.Fatalf("%v (run scripts/setup.sh)", ErrNoQuickJS)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := interp.Config{
		Language: interp.JavaScript,
		Env:      append(os.Environ(), "GREETING=hi"),
	}
	if quickjs {
		cfg.QuickJS = []string{os.Args[0]}
		cfg.Env = append(cfg.Env, kernelEnv+"="+QuickJSModule)
	}
	k, err := interp.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("starting the QuickJS kernel: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

func cell(t *testing.T, k *interp.Kernel, code string, timeout time.Duration) *interp.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := k.Execute(ctx, code, timeout, 1<<20, nil)
	if err != nil {
		t.Fatalf("cell %q: %v", code, err)
	}
	return res
}

func mainText(r *interp.ExecResult) string {
	if r.MainResult < 0 || r.MainResult >= len(r.Results) {
		return ""
	}
	return r.Results[r.MainResult]["text/plain"]
}

// TestQuickJSKernel runs cells through package interp's protocol on QuickJS
// in wazero: state across cells, output ordered before results, errors with
// their messages, modern syntax, top-level await, timers, environment
// variables, and timeouts and interrupts that stop synchronous code while
// the context keeps its state.
func TestQuickJSKernel(t *testing.T) {
	k := quickJS(t)
	cases := []struct {
		code, out, result, errName, errValue string
	}{
		{code: "let x = 20; const y = 1; var z = 1; x + y + z", result: "22"},
		{code: "x * 2 + y", result: "41"},
		{code: "console.log('a', 1, [1, 2]); 'done'", out: "a 1 [ 1, 2 ]\n", result: "'done'"},
		{code: "({a: 1, b: 'two', c: [3]})", result: "{ a: 1, b: 'two', c: [ 3 ] }"},
		{code: "{a: 1}", result: "{ a: 1 }"},
		{code: "class P { #secret = 42; get s() { return this.#secret; } static #n = 1; }\nnew P().s", result: "42"},
		{code: "null ?? 'fallback'", result: "'fallback'"},
		{code: "(2.5).toFixed(0) + ' ' + (1.005).toFixed(2) + ' ' + (0.5).toFixed(0) + ' ' + (-2.5).toFixed(0) + ' ' + (1.45).toFixed(1) + ' ' + (8.345).toFixed(2)", result: "'3 1.00 1 -3 1.4 8.35'"},
		{code: "(123.456).toExponential(1) + ' ' + (9.95).toExponential(1) + ' ' + (0.000125).toPrecision(2)", result: "'1.2e+2 9.9e+0 0.00013'"},
		{code: "throw new TypeError('bad thing')", errName: "TypeError", errValue: "bad thing"},
		{code: "undefinedName + 1", errName: "ReferenceError", errValue: "undefinedName' is not defined"},
		{code: "function (", errName: "SyntaxError"},
		{code: "const w = await new Promise((r) => setTimeout(() => r(7), 20)); w * 6", result: "42"},
		{code: "w + 1", result: "8"},
		{code: "process.env.GREETING", result: "'hi'"},
		{code: "x", result: "20"},
		// QuickJS's own stack check, not a trap of wazero's, which would end
		// the kernel.
		{code: "function f(n) { return f(n + 1) } f(0)", errName: "InternalError", errValue: "stack overflow"},
		{code: "function g(n) { return [n].map((v) => g(v + 1)) } g(0)", errName: "InternalError", errValue: "stack overflow"},
		{code: "JSON.parse('['.repeat(1e5))", errName: "SyntaxError", errValue: "stack overflow"},
		{code: "function h(n) { return new Proxy({}, { get: () => h(n + 1).x }) } h(0).x", errName: "InternalError", errValue: "stack overflow"},
		{code: "x", result: "20"},
	}
	for _, c := range cases {
		r := cell(t, k, c.code, 30*time.Second)
		if r.Stdout != c.out {
			t.Errorf("cell %q: stdout %q, want %q", c.code, r.Stdout, c.out)
		}
		if got := mainText(r); got != c.result {
			t.Errorf("cell %q: result %q, want %q (error %+v)", c.code, got, c.result, r.Error)
		}
		switch {
		case c.errName == "" && r.Error != nil:
			t.Errorf("cell %q: error %+v", c.code, r.Error)
		case c.errName != "" && (r.Error == nil || r.Error.Name != c.errName || !strings.Contains(r.Error.Value, c.errValue)):
			t.Errorf("cell %q: error %+v, want %s: %s (stderr %q)", c.code, r.Error, c.errName, c.errValue, r.Stderr)
		}
	}

	// A synchronous endless loop ends at the cell's timeout; the context
	// keeps its state.
	r := cell(t, k, "for (;;) {}", 500*time.Millisecond)
	if r.Error == nil || r.Error.Name != "TimeoutError" || r.Restarted {
		t.Fatalf("endless loop: error %+v restarted %v stderr %q, want a TimeoutError in the same kernel", r.Error, r.Restarted, r.Stderr)
	}
	if got := mainText(cell(t, k, "x + 1", 30*time.Second)); got != "21" {
		t.Fatalf("after the timeout: x + 1 = %q, want 21 (state lost)", got)
	}

	// An interrupt stops synchronous code too.
	done := make(chan *interp.ExecResult, 1)
	go func() {
		res, _ := k.Execute(context.Background(), "globalThis.spun = 0; for (;;) { spun++ }", 0, 1<<20, nil)
		done <- res
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		time.Sleep(100 * time.Millisecond)
		if err := k.Interrupt(); err == nil {
			select {
			case r = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the interrupted cell did not end")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no cell to interrupt")
		}
	}
	if r == nil || r.Error == nil || r.Error.Name != "KeyboardInterrupt" || r.Restarted {
		t.Fatalf("interrupt: %+v, want a KeyboardInterrupt in the same kernel", r)
	}
	if got := mainText(cell(t, k, "spun > 0 && x === 20", 30*time.Second)); got != "true" {
		t.Fatalf("after the interrupt: %q, want true", got)
	}

	// A cell cannot reach the host's primitives.
	if got := mainText(cell(t, k, "typeof __host", 30*time.Second)); got != "'undefined'" {
		t.Fatalf("typeof __host = %s, want 'undefined'", got)
	}
}

// TestQuickJSMemoryLimit: a cell that allocates past the memory limit gets
// an error, not the host's memory; the context survives.
func TestQuickJSMemoryLimit(t *testing.T) {
	k := quickJS(t)
	cell(t, k, "let keep = 'still here'", 30*time.Second)
	r := cell(t, k, "const a = []; for (;;) a.push(new Array(1e5).fill(1))", 3*time.Minute)
	if r.Error == nil {
		t.Fatal("allocating without end succeeded")
	}
	t.Logf("allocation error: %+v restarted=%v", r.Error, r.Restarted)
	if r.Restarted {
		return
	}
	if got := mainText(cell(t, k, "keep", 30*time.Second)); got != "'still here'" {
		t.Fatalf("after the oom: keep = %q", got)
	}
}

// The JavaScript cell benchmarks, QuickJS in wazero against node's kernel in
// the same run: a warm cell (`n += 1`, state kept), and a kernel's start to
// its first cell's result.
// go test -run '^$' -bench QuickJS -benchtime 200x ./runtime/wasm
func BenchmarkQuickJSCell(b *testing.B) {
	for _, engine := range []struct {
		name    string
		quickjs bool
	}{{"quickjs-wasm", true}, {"node", false}} {
		b.Run(engine.name, func(b *testing.B) {
			k := startJS(b, engine.quickjs)
			defer k.Close()
			ctx := context.Background()
			if _, err := k.Execute(ctx, "var n = 0", 0, 1<<20, nil); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				r, err := k.Execute(ctx, "n += 1", 0, 1<<20, nil)
				if err != nil || r.Error != nil {
					b.Fatalf("%+v %v", r, err)
				}
			}
		})
	}
}

func BenchmarkQuickJSStart(b *testing.B) {
	for _, engine := range []struct {
		name    string
		quickjs bool
	}{{"quickjs-wasm", true}, {"node", false}} {
		b.Run(engine.name, func(b *testing.B) {
			for range b.N {
				k := startJS(b, engine.quickjs)
				r, err := k.Execute(context.Background(), "1 + 1", 0, 1<<20, nil)
				if err != nil || r.Error != nil {
					b.Fatalf("%+v %v", r, err)
				}
				k.Close()
			}
		})
	}
}
