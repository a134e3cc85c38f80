package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/runtime/wasm"
)

// TestRunRuntimeWasm: `airlock run --runtime wasm -- MODULE` runs a module
// file from the host; --json lists what the module was given; a network
// mode, --code and a missing module are refused with the cause.
func TestRunRuntimeWasm(t *testing.T) {
	dir := t.TempDir()
	mod := filepath.Join(dir, "hello.wasm")
	if err := os.WriteFile(mod, wasm.HelloModule(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, nil, "run", "--runtime", "wasm", "--", mod)
	if code != 0 || out != wasm.HelloOutput {
		t.Fatalf("code %d out %q err %q", code, out, errOut)
	}
	out, errOut, code = runCLI(t, nil, "run", "--runtime", "wasm", "--json", "--mount", dir+":/data:ro", "--", mod)
	var res struct {
		Status   string
		Enforced []struct{ Name, State, Detail string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 {
		t.Fatalf("code %d out %q err %q: %v", code, out, errOut, err)
	}
	if res.Status != "ok" || len(res.Enforced) == 0 || res.Enforced[0].Name != "wasm" || !strings.Contains(out, "/data (ro, "+dir+")") {
		t.Fatalf("got %s", out)
	}
	_, errOut, code = runCLI(t, nil, "run", "--runtime", "wasm", "--net", "open", "--", mod)
	if code == 0 || !strings.Contains(errOut, "not available with runtime wasm") {
		t.Fatalf("--net open: code %d err %q", code, errOut)
	}
	_, errOut, code = runCLI(t, nil, "run", "--runtime", "wasm", "--code", "print(1)")
	if code != exitUsage || !strings.Contains(errOut, "--code and --image are not available") {
		t.Fatalf("--code: code %d err %q", code, errOut)
	}
	_, errOut, code = runCLI(t, nil, "run", "--runtime", "wasm", "--", filepath.Join(dir, "missing.wasm"))
	if code == 0 || !strings.Contains(errOut, "missing.wasm") {
		t.Fatalf("missing module: code %d err %q", code, errOut)
	}
}
