// Package probebuild builds the syscall probe (github.com/airlock-dev/airlock/internal/probe) for
// tests that run it inside sandboxes.
package probebuild

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// probePackage is the import path of the probe program.
const probePackage = "github.com/airlock-dev/airlock/internal/probe"

var (
	once   sync.Once
	binary []byte
	errBin error
)

// Build builds the probe as a static binary (CGO_ENABLED=0) once per test
// binary and returns the path of a fresh executable copy in t.TempDir(),
// which the caller may copy, bind-mount or delete as it likes. It fails the
// test if the probe cannot be built.
func Build(t testing.TB) string {
	t.Helper()
	once.Do(func() { binary, errBin = compile() })
	if errBin != nil {
		t.Fatalf("build probe: %v", errBin)
	}
	path := filepath.Join(t.TempDir(), "probe")
	if err := os.WriteFile(path, binary, 0o755); err != nil {
		t.Fatalf("write probe: %v", err)
	}
	return path
}

// compile runs go build into a scratch directory and returns the binary's
// bytes; the directory is removed before returning, so nothing outlives the
// test binary.
func compile() ([]byte, error) {
	goTool, err := findGo()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "airlock-probe-build-")
	if err != nil {
		return nil, fmt.Errorf("make build directory: %w", err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "probe")
	cmd := exec.Command(goTool, "build", "-trimpath", "-ldflags=-s -w", "-o", out, probePackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build %s: %w\n%s", probePackage, err, stderr.Bytes())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("read built probe: %w", err)
	}
	return b, nil
}

// findGo locates the go command: $PATH first (go test puts its own
// toolchain's bin directory there), then the GOROOT the test was built with.
func findGo() (string, error) {
	p, err := exec.LookPath("go")
	if err == nil {
		return p, nil
	}
	//lint:ignore SA1019 a fallback when go is not on $PATH: the GOROOT this test binary was built with
	if root := runtime.GOROOT(); root != "" {
		alt := filepath.Join(root, "bin", "go")
		if _, statErr := os.Stat(alt); statErr == nil {
			return alt, nil
		}
	}
	return "", fmt.Errorf("find the go command: %w", err)
}
