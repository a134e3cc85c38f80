package mcp_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestCreateSandboxRuntime: create_sandbox takes a runtime; a gvisor
// sandbox runs commands and code behind gVisor's kernel, and an unknown
// runtime is a tool error naming the choices.
func TestCreateSandboxRuntime(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	if out := mustFail(t, cs, "create_sandbox", map[string]any{"runtime": "kvm"}); !strings.Contains(out, `unknown "kvm" (want native, gvisor, wasm or microvm)`) {
		t.Fatalf("unknown runtime: %q", out)
	}
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	out := mustOK(t, cs, "create_sandbox", map[string]any{"runtime": "gvisor"})
	m := regexp.MustCompile(`created sandbox (sb-[0-9a-f]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("create: %q", out)
	}
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "uname -r", "sandbox_id": m[1]}); !strings.Contains(out, "gvisor") {
		t.Fatalf("uname -r in the gvisor sandbox: %q", out)
	}
	if out := mustOK(t, cs, "run_code", map[string]any{"code": "6*7", "sandbox_id": m[1]}); !strings.Contains(out, "42") {
		t.Fatalf("run_code in the gvisor sandbox: %q", out)
	}
}

// TestWasmJavaScriptCells: an MCP client's JavaScript cells in a wasm
// sandbox run QuickJS for WASI (not node) and keep their state.
func TestWasmJavaScriptCells(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	out := mustOK(t, cs, "create_sandbox", map[string]any{"runtime": "wasm"})
	m := regexp.MustCompile(`created sandbox (sb-[0-9a-f]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("create: %q", out)
	}
	mustOK(t, cs, "run_code", map[string]any{"code": "let kept = 6", "language": "javascript", "sandbox_id": m[1]})
	out = mustOK(t, cs, "run_code", map[string]any{"code": "`${kept * 7} ${process.version} ${typeof require}`", "language": "javascript", "sandbox_id": m[1]})
	if !strings.Contains(out, "42 QuickJS 2021-03-27 undefined") {
		t.Fatalf("run_code in the wasm sandbox: %q", out)
	}
}
