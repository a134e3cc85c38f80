package e2b

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-dev/airlock/internal/testserver"
)

// e2bSDKDir returns the absolute path of tests/js, where E2B's JavaScript
// SDK is installed (`npm ci`, which scripts/setup.sh runs), for tests that
// drive the real SDK with node as root; without root or the SDK the test
// is skipped, saying what is missing.
func e2bSDKDir(t *testing.T) string {
	t.Helper()
	testserver.NeedRoot(t)
	jsDir, err := filepath.Abs("../tests/js")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules", "e2b", "package.json")); err != nil {
		t.Skip("tests/js/node_modules lacks e2b: run `npm ci` in tests/js (scripts/setup.sh does)")
	}
	return jsDir
}
