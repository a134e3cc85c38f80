package mcp_test

import (
	"strings"
	"testing"
)

// TestCreateAboveCeilingRefused (issue 20, finding 5): create_sandbox is
// held to the server's ceilings (here the host's) and the error names the
// field and the ceiling.
func TestCreateAboveCeilingRefused(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	out := mustFail(t, cs, "create_sandbox", map[string]any{"memory_mb": 1 << 20, "cpus": 64})
	for _, want := range []string{"memory_bytes 1099511627776 (1.0 TiB) is above the ceiling of this server", "cpus 64 is above the ceiling of this server"} {
		if !strings.Contains(out, want) {
			t.Errorf("create_sandbox 1 TiB, 64 cpus: %q does not say %q", out, want)
		}
	}
	if got := e.m.Ceilings(); got.MemoryBytes <= 0 || got.CPUs < 1 {
		t.Errorf("the manager's ceilings default to the host's: %+v", got)
	}
}
