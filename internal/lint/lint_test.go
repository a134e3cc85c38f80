package lint

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestStaticcheck builds the pinned staticcheck (the go build cache keeps
// it) and runs it over every package of the module; any finding fails the
// test. staticcheck keeps its own cache of analysed packages
// ($XDG_CACHE_HOME/staticcheck), so a second run only analyses what
// changed.
func TestStaticcheck(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: staticcheck analyses the whole module")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "staticcheck")
	build := exec.Command("go", "build", "-o", bin, "honnef.co/go/tools/cmd/staticcheck")
	build.Dir = filepath.Join(root, "scripts/release")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building staticcheck: %v\n%s", err, out)
	}
	run := exec.Command(bin, "./...")
	run.Dir = root
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("staticcheck ./... (fix, or exclude in staticcheck.conf with a reason): %v\n%s", err, out)
	}
}
