package wasm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// stuckEnv, when set in a test binary's environment, makes it run the Go
// guest module it names in "loop" mode (an endless loop that makes no host
// call) with a 300 ms wall-time limit on an engine without context checks
// whose stop function exits the process with exitKilled, as ServeKernel's
// does.
const stuckEnv = "AIRLOCK_TEST_STUCK_MODULE"

const stopCalled = "stop called"

func runStuck(path string) int {
	ctx := context.Background()
	m, err := ReadModule(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	e, err := NewEngine(ctx, "", WithoutContextChecks(func() {
		fmt.Fprintln(os.Stderr, stopCalled)
		os.Exit(exitKilled)
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	p, err := policy.Preset(policy.Strict)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	p.Limits.WallTime = 300 * time.Millisecond
	res, err := e.Run(ctx, m, native.Config{Policy: p, Args: []string{m.Name, "loop"}}, native.RunOptions{})
	fmt.Fprintf(os.Stderr, "the endless loop returned: %+v %v\n", res, err)
	return 0
}

// TestWithoutContextChecksStopsAnEndlessLoop: on an engine without
// wazero's context checks (the QuickJS kernel's), module code that loops
// without a host call cannot be stopped inside the process; once its wall
// time is over, the engine calls stop, which ends the process, rather than
// letting the code run on.
func TestWithoutContextChecksStopsAnEndlessLoop(t *testing.T) {
	g := guest(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), stuckEnv+"="+g.Name)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the endless loop still ran 3 minutes after its 300 ms wall time (stderr %q)", stderr.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitKilled || !strings.Contains(stderr.String(), stopCalled) {
		t.Fatalf("the process ended with %v, stderr %q; want exit %d after %q", err, stderr.String(), exitKilled, stopCalled)
	}
}

// TestWithoutContextChecksRunsModules: an engine without context checks
// runs a module as any engine does, and does not call stop for a run that
// ended by itself, even after the run's context is gone.
func TestWithoutContextChecksRunsModules(t *testing.T) {
	var stopped atomic.Bool
	e, err := NewEngine(context.Background(), "", WithoutContextChecks(func() { stopped.Store(true) }))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := strict(t)
	p.Filesystem.Workspace = t.TempDir()
	g := guest(t)
	ctx, cancel := context.WithCancel(context.Background())
	res, err := e.Run(ctx, g, native.Config{Policy: p, Args: []string{g.Name, "args", "a", "b"}}, native.RunOptions{Capture: true})
	cancel()
	if err != nil || res.Status != native.StatusOK || !strings.Contains(res.Stdout, "a") {
		t.Fatalf("run: %+v %v", res, err)
	}
	time.Sleep(stopGrace + time.Second)
	if stopped.Load() {
		t.Fatal("stop was called for a run that had ended")
	}
}
