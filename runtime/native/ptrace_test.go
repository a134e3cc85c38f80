package native_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// tracemePrelude makes PTRACE_TRACEME available to the scripts below.
const tracemePrelude = `
import ctypes, os, signal, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def traceme():
    if libc.ptrace(0, 0, 0, 0) != 0:
        sys.exit("PTRACE_TRACEME failed: errno %d" % ctypes.get_errno())
signal.signal(signal.SIGUSR1, lambda *a: None)
`

// tracemeScripts are programs that make the launcher their tracer (the
// light profile allows ptrace). The marker is the argument of the final
// sleep, so that leftovers can be found from the host.
var tracemeScripts = map[string]string{
	// PID 1 itself is traced and takes a signal: a ptrace-stop.
	"init-signal": `traceme(); os.kill(os.getpid(), signal.SIGUSR1); os.system("sleep MARKER")`,
	// A thread of PID 1 is traced and stops; the rest runs on.
	"thread-signal": `
def t():
    traceme(); signal.pthread_kill(threading.get_ident(), signal.SIGUSR1); time.sleep(1000)
threading.Thread(target=t, daemon=True).start(); os.system("sleep MARKER")`,
	// A traced thread that is killed with its process stays a zombie for
	// its tracer to reap; until it is, the init's exit is held back.
	"thread-exit": `
def t():
    traceme(); time.sleep(1000)
threading.Thread(target=t, daemon=True).start(); time.sleep(0.5); os._exit(3)`,
	// Same, and the process runs into the deadline.
	"thread-deadline": `
def t():
    traceme(); time.sleep(1000)
threading.Thread(target=t, daemon=True).start(); os.system("sleep MARKER")`,
}

// runGuarded runs cfg and fails the test if Run has not returned after a
// generous guard (the defect being tested is a launcher that never returns).
func runGuarded(t *testing.T, cfg native.Config) *native.Result {
	t.Helper()
	type out struct {
		res *native.Result
		err error
	}
	ch := make(chan out, 1)
	go func() {
		res, err := native.Run(context.Background(), cfg, native.RunOptions{Capture: true})
		ch <- out{res, err}
	}()
	select {
	case o := <-ch:
		if o.err != nil {
			t.Fatal(o.err)
		}
		return o.res
	case <-time.After(time.Minute):
		t.Fatalf("Run did not return a minute after a %s deadline", cfg.Policy.Limits.WallTime)
		return nil
	}
}

// TestTracemeCannotStopTheClock: a sandbox process that makes the launcher
// its tracer never stops the launcher's clock, never fakes an exit, and
// leaves nothing behind on the host.
func TestTracemeCannotStopTheClock(t *testing.T) {
	for name, script := range tracemeScripts {
		t.Run(name, func(t *testing.T) {
			marker := fmt.Sprintf("%d.%d", 610000+os.Getpid(), len(name))
			p, err := policy.Preset(policy.Light)
			if err != nil {
				t.Fatal(err)
			}
			p.Limits.WallTime = 3 * time.Second
			src := tracemePrelude + strings.ReplaceAll(script, "MARKER", marker)
			res := runGuarded(t, native.Config{Policy: p, Args: []string{"/usr/bin/python3", "-c", src}})
			t.Logf("status %s exit %d signal %q error %q stderr %q", res.Status, res.ExitCode, res.Signal, res.Error, res.Stderr)
			if strings.Contains(res.Stderr, "PTRACE_TRACEME failed") {
				t.Fatalf("the light profile must allow ptrace: %s", res.Stderr)
			}
			switch name {
			case "init-signal", "thread-signal":
				if res.Status != native.StatusKilled || !strings.Contains(res.Error, "PTRACE_TRACEME") {
					t.Errorf("status %s error %q, want killed naming PTRACE_TRACEME", res.Status, res.Error)
				}
			case "thread-exit":
				if res.Status != native.StatusNonzeroExit || res.ExitCode != 3 {
					t.Errorf("status %s exit %d, want nonzero_exit 3", res.Status, res.ExitCode)
				}
			case "thread-deadline":
				if res.Status != native.StatusTimeout {
					t.Errorf("status %s, want timeout", res.Status)
				}
			}
			if hostHasProcess(marker) {
				t.Error("a sandbox process survived the run")
			}
		})
	}
}

// TestTracemeRunCLISIGTERM: `airlock run` ends, at the latest on SIGTERM,
// when its program or a thread of it made the launcher its tracer.
func TestTracemeRunCLISIGTERM(t *testing.T) {
	bin := airlockCLI(t)
	for _, name := range []string{"init-signal", "thread-deadline"} {
		t.Run(name, func(t *testing.T) {
			marker := fmt.Sprintf("%d.%d", 620000+os.Getpid(), len(name))
			src := tracemePrelude + "# " + marker + "\n" + strings.ReplaceAll(tracemeScripts[name], "MARKER", marker)
			cmd := exec.Command(bin, "run", "--profile", "light", "--timeout", "10m", "--", "/usr/bin/python3", "-c", src)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			// The launcher's command line holds the marker too: wait for a
			// second process with it (or for the run to end by itself).
			var err error
			exited := false
			for deadline := time.Now().Add(30 * time.Second); !exited && countProcesses(marker) < 2; time.Sleep(20 * time.Millisecond) {
				select {
				case err = <-done:
					exited = true
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("sandbox never started")
				}
			}
			if !exited {
				time.Sleep(200 * time.Millisecond) // let the program reach its ptrace state
				cmd.Process.Signal(syscall.SIGTERM)
				select {
				case err = <-done:
				case <-time.After(time.Minute):
					t.Fatal("airlock run ignored SIGTERM for a minute")
				}
			}
			t.Logf("airlock run ended: %v", err)
			if err == nil {
				t.Error("airlock run reported success")
			}
			if hostHasProcess(marker) {
				t.Error("a sandbox process survived airlock run")
			}
		})
	}
}

// TestTracemeDeniedOutsideLight: strict and standard deny ptrace, so a
// program cannot make the launcher its tracer at all and ends normally.
func TestTracemeDeniedOutsideLight(t *testing.T) {
	for _, profile := range []policy.Profile{policy.Strict, policy.Standard} {
		t.Run(string(profile), func(t *testing.T) {
			p, err := policy.Preset(profile)
			if err != nil {
				t.Fatal(err)
			}
			p.Limits.WallTime = 30 * time.Second
			src := tracemePrelude + strings.ReplaceAll(tracemeScripts["init-signal"], "MARKER", "1")
			res := runGuarded(t, native.Config{Policy: p, Args: []string{"/usr/bin/python3", "-c", src}})
			if res.Status != native.StatusNonzeroExit || !strings.Contains(res.Stderr, "PTRACE_TRACEME failed: errno 1") {
				t.Errorf("status %s stderr %q: want PTRACE_TRACEME denied with EPERM", res.Status, res.Stderr)
			}
		})
	}
}
