package e2b_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestE2BSDK2026 runs tests/js/e2b-2026.mjs, which drives the official e2b
// package (the newest release in tests/js/package.json) through E2B's 2026
// surface: snapshots (one to many, their kind, surviving their sandbox,
// deletion) with a second key that must neither see, use nor delete the
// first key's snapshots, and filesystem-only pause (keepMemory: false,
// onResume: 'reboot', onTimeout with keepMemory: false). It runs once on
// a native server and once on a gvisor one (where runsc is installed).
func TestE2BSDK2026(t *testing.T) {
	testserver.NeedRoot(t)
	jsDir, err := filepath.Abs("../tests/js")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules", "e2b", "package.json")); err != nil {
		t.Skip("tests/js/node_modules lacks e2b: run `npm ci` in tests/js (scripts/setup.sh does)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	for _, runtime := range []string{"native", "gvisor"} {
		t.Run(runtime, func(t *testing.T) {
			if runtime == "gvisor" {
				if _, err := gvisor.Available(); err != nil {
					t.Skipf("gvisor tier unavailable: %v", err)
				}
			}
			state := testserver.StateDir(t)
			key := testserver.NewKey(t, state, "e2b-2026", "--e2b")
			other := testserver.NewKey(t, state, "e2b-2026-other", "--e2b")
			srv := testserver.Start(t, state, "--default-runtime", runtime)
			defer srv.Stop()
			_, err := runScript(t, node, jsDir, "e2b-2026.mjs", 8*time.Minute, "E2B_API_URL="+srv.URL, "E2B_SANDBOX_URL="+srv.URL,
				"E2B_API_KEY="+key, "E2B_OTHER_API_KEY="+other, "E2B_RUNTIME="+runtime)
			if err != nil {
				t.Fatalf("e2b-2026 scenario failed: %v", err)
			}
			assertNoneRunning(t, srv.URL, key)
			assertNoneRunning(t, srv.URL, other)
			// Deleted snapshots leave nothing on disk.
			left, _ := filepath.Glob(filepath.Join(state, "e2b-snapshots", "snapshot-*"))
			if len(left) != 0 {
				t.Fatalf("snapshot directories left after every snapshot was deleted: %v", left)
			}
		})
	}
}
