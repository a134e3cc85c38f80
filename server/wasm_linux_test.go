package server_test

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/wasm"
)

// TestE2EWasmSandbox: a sandbox with runtime wasm takes a module through
// the files API and exec runs it from the workspace (absolute or relative
// to /workspace); a
// shell command is refused with 400; the server lists the runtime.
func TestE2EWasmSandbox(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "wasm")
	s := startServer(t, state)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	if info, err := c.Info(ctx); err != nil || !slices.Contains(info.Runtimes, "wasm") {
		t.Fatalf("info: %+v %v", info, err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Timeout: 120, Runtime: "wasm", Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.ID)
	if sb.Runtime != "wasm" {
		t.Fatalf("runtime %q", sb.Runtime)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/workspace/hello.wasm", bytes.NewReader(wasm.HelloModule()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, argv := range [][]string{{"/workspace/hello.wasm"}, {"hello.wasm", "ignored-arg"}} {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: argv})
		if err != nil || res.ExitCode != 0 || res.Stdout != wasm.HelloOutput {
			t.Fatalf("exec %q: %+v %v", argv, res, err)
		}
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/workspace/missing.wasm"}})
	if err != nil || res.ExitCode == 0 || !strings.Contains(res.Stderr, "missing.wasm") {
		t.Fatalf("missing module: %+v %v", res, err)
	}
	_, err = c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "echo native"})
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Message, "WASI modules") {
		t.Fatalf("shell in a wasm sandbox: %v", err)
	}

	// JavaScript cells in a wasm sandbox run QuickJS for WASI in wazero,
	// not node: state persists across cells; the kernel is WebAssembly.
	for i, cell := range []struct{ code, text string }{
		{"let n = 40; const hello = process.env.GREETING; n + 2", "42"},
		{"`${hello} ${n} ${typeof require} ${process.version}`", "'hi 40 undefined QuickJS 2021-03-27'"},
		{"class K { #v = 5; get v() { return this.#v } }; new K().v", "5"},
	} {
		r, err := c.RunCode(ctx, sb.ID, client.CodeRequest{Code: cell.code, Language: "javascript"})
		if err != nil || r.Error != nil || r.Text != cell.text {
			t.Fatalf("javascript cell %d %q: %+v %v", i, cell.code, r, err)
		}
	}
	ts, err := c.RunCode(ctx, sb.ID, client.CodeRequest{Code: "const t: number = 40 * 2; t", Language: "typescript"})
	if err != nil || ts.Error != nil || ts.Text != "80" {
		t.Fatalf("typescript cell: %+v %v", ts, err)
	}
	bad, err := c.RunCode(ctx, sb.ID, client.CodeRequest{Code: "null.x", Language: "javascript"})
	if err != nil || bad.Error == nil || bad.Error.Name != "TypeError" {
		t.Fatalf("javascript error: %+v %v", bad, err)
	}
}
