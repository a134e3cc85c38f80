package policy

import (
	"strings"
	"testing"
)

// TestRuntimeWasm: "wasm" is a runtime, and it refuses any network mode
// but none (WASI preview 1 modules get no sockets).
func TestRuntimeWasm(t *testing.T) {
	if r, err := ParseRuntime("wasm"); err != nil || r != RuntimeWasm {
		t.Fatalf("ParseRuntime(wasm) = %q, %v", r, err)
	}
	p, err := Preset(Strict)
	if err != nil {
		t.Fatal(err)
	}
	p.Runtime = RuntimeWasm
	if err := p.Validate(); err != nil {
		t.Fatalf("wasm with network none: %v", err)
	}
	p.Network = Network{Mode: NetAllowlist, Allow: []string{"example.com"}}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "not available with runtime wasm") {
		t.Fatalf("wasm with an allowlist: %v", err)
	}
}
