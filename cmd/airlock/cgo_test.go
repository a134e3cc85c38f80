package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// TestCgoBuildRefused: a binary built with cgo cannot host the agent (its
// capability drop needs AllThreadsSyscall), so serve and mcp refuse to start
// with a message naming the fix, instead of every create failing with
// "connection reset by peer". The static binary the tests use starts.
func TestCgoBuildRefused(t *testing.T) {
	if err := checkStaticBuild([]debug.BuildSetting{{Key: "CGO_ENABLED", Value: "0"}}); err != nil {
		t.Fatalf("static build refused: %v", err)
	}
	if err := checkStaticBuild([]debug.BuildSetting{{Key: "CGO_ENABLED", Value: "1"}}); !errors.Is(err, errCgoBuild) {
		t.Fatalf("cgo build: got %v", err)
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no C compiler: cannot build a cgo binary")
	}
	bin := filepath.Join(t.TempDir(), "airlock-cgo")
	build := exec.Command("go", "build", "-o", bin, "github.com/airlock-dev/airlock/cmd/airlock")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build with cgo: %v\n%s", err, out)
	}
	for _, args := range [][]string{
		{"serve", "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--no-auth"},
		{"mcp", "--state-dir", t.TempDir()},
	} {
		// Bounded: a binary that wrongly starts would serve forever.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin, args...)
		out, err := cmd.CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitSetup {
			t.Fatalf("%s with a cgo build: want exit %d, got %v\n%s", args[0], exitSetup, err, out)
		}
		if !strings.Contains(string(out), "CGO_ENABLED=0") {
			t.Fatalf("%s: message does not name the fix: %s", args[0], out)
		}
	}
}
