package dashboard

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestCommittedBuildIsReproducible: dist/ (embedded, committed so that go
// build needs no npm) is what web/build.mjs makes from the sources with the
// pinned esbuild and xterm.js (web/package-lock.json; scripts/setup.sh --tests runs
// npm ci). Rebuild with `cd dashboard/web && npm ci && node build.mjs`.
func TestCommittedBuildIsReproducible(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node on PATH (scripts/setup.sh --tests installs the dashboard's build tools)")
	}
	if _, err := os.Stat("web/node_modules/esbuild"); err != nil {
		t.Skip("dashboard/web/node_modules missing: run scripts/setup.sh (npm ci in dashboard/web)")
	}
	out := t.TempDir()
	if b, err := exec.Command(node, "web/build.mjs", out).CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	built := map[string]bool{}
	filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(out, p)
			built[rel] = true
		}
		return nil
	})
	fs.WalkDir(Assets(), ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !built[p] {
			t.Errorf("dist/%s is committed but the build does not make it", p)
		}
		return nil
	})
	for name := range built {
		want, _ := os.ReadFile(filepath.Join(out, name))
		got, err := fs.ReadFile(Assets(), name)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("dist/%s differs from what web/ builds (%d bytes committed, %d built): rebuild with node dashboard/web/build.mjs", name, len(got), len(want))
		}
	}
}
