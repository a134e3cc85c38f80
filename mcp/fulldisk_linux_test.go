package mcp_test

import (
	"os"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/manager"
)

// TestFullDiskFailsClosed: with the state directory's file system full,
// run_command, write_file and run_code are refused, naming the full
// directory, and do not happen.
func TestFullDiskFailsClosed(t *testing.T) {
	needRoot(t)
	dir := shortDir(t)
	testserver.MountTmpfs(t, dir, "24m")
	e := newEnvAt(t, dir, 4, manager.EgressConfig{}, nil)
	cs := e.connect(t)
	mustOK(t, cs, "write_file", map[string]any{"path": "before.txt", "content": "b"})
	filler := testserver.FillDisk(t, dir)
	full := "no space left on device: " + dir
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"run_command", map[string]any{"command": "touch /workspace/ran-command"}},
		{"write_file", map[string]any{"path": "ran-write", "content": "x"}},
		{"run_code", map[string]any{"language": "bash", "code": "touch /workspace/ran-code"}},
	} {
		r := call(t, cs, c.tool, c.args)
		if !r.IsError || !strings.Contains(text(r), full) {
			t.Fatalf("%s on a full disk: error %v: %s", c.tool, r.IsError, text(r))
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	out := mustOK(t, cs, "list_files", map[string]any{"path": "/workspace"})
	if !strings.Contains(out, "before.txt") || strings.Contains(out, "ran-") {
		t.Fatalf("/workspace after the refused calls:\n%s", out)
	}
}
