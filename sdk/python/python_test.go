// Package python runs the Python SDK's test suite (sdk/python/tests)
// against a real server, so that `go test ./...` covers it.
package python

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// debianPython is the interpreter the suite runs on: Debian's, as on CI.
const debianPython = "/usr/bin/python3"

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}

// TestPythonSDK starts `airlock serve` with an API key and a registry
// holding a busybox image, and runs `python3 -m unittest tests.test_sdk`
// against it on Debian's Python; every Python test must pass.
func TestPythonSDK(t *testing.T) {
	testserver.NeedRoot(t)
	if _, err := os.Stat(debianPython); err != nil {
		t.Fatalf("%s: %v (scripts/setup.sh installs python3)", debianPython, err)
	}
	reg := imagetest.Registry(t)
	ref := imagetest.Push(t, reg, "sdk/busybox:1", imagetest.Busybox(t))
	state := testserver.StateDir(t)
	key := testserver.NewKey(t, state, "python-sdk")
	srv := testserver.Start(t, state, "--image-registry", reg)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, debianPython, "-m", "unittest", "-v", "tests.test_sdk")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "PYTHONDONTWRITEBYTECODE=1",
		"AIRLOCK_URL=" + srv.URL, "AIRLOCK_API_KEY=" + key, "AIRLOCK_TEST_IMAGE=" + ref}
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil {
		t.Fatalf("the Python SDK's tests failed: %v", err)
	}
	m := regexp.MustCompile(`(?m)^Ran (\d+) tests?`).FindSubmatch(out)
	if m == nil || string(m[1]) == "0" || !strings.Contains(string(out), "\nOK") {
		t.Fatalf("the suite ran no test or did not end OK")
	}
}

// TestPythonSDKTypes: the package is typed throughout: mypy --strict
// (Debian's mypy, installed by scripts/setup.sh --tests) finds no issue.
func TestPythonSDKTypes(t *testing.T) {
	if err := exec.Command(debianPython, "-c", "import mypy").Run(); err != nil {
		t.Skip("mypy is not installed (scripts/setup.sh --tests installs it)")
	}
	cmd := exec.Command(debianPython, "-m", "mypy", "--strict", "--no-incremental", "airlock")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "MYPY_CACHE_DIR=" + t.TempDir()}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mypy --strict airlock: %v\n%s", err, out)
	}
}
