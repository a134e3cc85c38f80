package native_test

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/internal/testserver"
)

// airlockCLI builds the airlock binary once per test binary.
func airlockCLI(t *testing.T) string { return testserver.Binary(t) }

// TestLauncherCrashCleanup: SIGKILL of `airlock run` kills the sandbox
// (parent-death signal) and the next run removes the orphaned cgroup.
func TestLauncherCrashCleanup(t *testing.T) {
	bin := airlockCLI(t)
	marker := "4242.99"
	cmd := exec.Command(bin, "run", "--", "sleep", marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The launcher's own command line holds the marker too: wait for the
	// sandbox's cgroup, then for a second process with the marker.
	for deadline := time.Now().Add(10 * time.Second); len(testserver.RunCgroups(cmd.Process.Pid)) == 0 || countProcesses(marker) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox never started (cgroups %v)", testserver.RunCgroups(cmd.Process.Pid))
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	for deadline := time.Now().Add(5 * time.Second); hostHasProcess(marker); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("sandbox survived its launcher's SIGKILL")
		}
	}
	if out, err := exec.Command(bin, "run", "--", "true").CombinedOutput(); err != nil {
		t.Fatalf("second run: %v %s", err, out)
	}
	if left := testserver.RunCgroups(cmd.Process.Pid); len(left) > 0 {
		t.Fatalf("orphaned cgroups not cleaned: %v", left)
	}
}

func countProcesses(marker string) int { return testserver.HostProcesses(marker) }

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}
