package pgtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Without PostgreSQL's binaries the tests fail and say how to get them;
// with several versions the newest is used.
func TestBinDir(t *testing.T) {
	root := t.TempDir()
	if _, err := binDir(root); err == nil || !strings.Contains(err.Error(), "run scripts/setup.sh") {
		t.Fatalf("no binaries: %v, want an error saying run scripts/setup.sh", err)
	}
	for _, v := range []string{"9", "15", "13"} {
		d := filepath.Join(root, v, "bin")
		os.MkdirAll(d, 0o755)
		for _, f := range []string{"postgres", "initdb"} {
			if err := os.WriteFile(filepath.Join(d, f), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if d, err := binDir(root); err != nil || d != filepath.Join(root, "15", "bin") {
		t.Fatalf("binDir = %q, %v; want version 15's", d, err)
	}
}
