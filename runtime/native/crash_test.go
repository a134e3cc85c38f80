package native_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"airlock/runtime/native/cgroups"

	"airlock/internal/testserver"
)

// airlockCLI builds the airlock binary once per test binary.
func airlockCLI(t *testing.T) string { return testserver.Binary(t) }

func cgroupDirs(t *testing.T, marker string) []string {
	info := cgroups.Detect()
	var found []string
	for _, base := range []string{"/sys/fs/cgroup/memory/airlock", "/sys/fs/cgroup/pids/airlock", "/sys/fs/cgroup/airlock", info.Root} {
		ents, _ := os.ReadDir(base)
		for _, e := range ents {
			if strings.Contains(e.Name(), marker) {
				found = append(found, filepath.Join(base, e.Name()))
			}
		}
	}
	return found
}

// TestLauncherCrashCleanup: SIGKILL of `airlock run` kills the sandbox
// (parent-death signal) and the next run removes the orphaned cgroup.
func TestLauncherCrashCleanup(t *testing.T) {
	bin := airlockCLI(t)
	marker := "4242.99"
	cmd := exec.Command(bin, "run", "--", "sleep", marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tag := "run-" + itoa(cmd.Process.Pid) + "-"
	// The launcher's own command line holds the marker too: wait for the
	// sandbox's cgroup, then for a second process with the marker.
	for deadline := time.Now().Add(10 * time.Second); len(cgroupDirs(t, tag)) == 0 || countProcesses(marker) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox never started (cgroups %v)", cgroupDirs(t, tag))
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
	if left := cgroupDirs(t, tag); len(left) > 0 {
		t.Fatalf("orphaned cgroups not cleaned: %v", left)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func countProcesses(marker string) int {
	n := 0
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if strings.Contains(string(b), marker) {
			n++
		}
	}
	return n
}

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}
