package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestRunscPrecompiledFilters: the runsc airlock uses is the build of
// scripts/runsc-seccomp/build.sh for the pinned version and the current
// build scripts, and its sentry and gofer load gVisor's precompiled seccomp
// programs, in both network modes airlock runs (none, and host inside the
// sandbox's own namespace), instead of compiling them at start.
func TestRunscPrecompiledFilters(t *testing.T) {
	rs, err := gvisor.Available()
	if err != nil {
		t.Skip(err)
	}
	stamp, err := exec.Command("../scripts/runsc-seccomp/build.sh", "--stamp", gvisor.Version).Output()
	if err != nil {
		t.Fatalf("build.sh --stamp: %v", err)
	}
	out, err := exec.Command(rs.Path, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", rs.Path, err)
	}
	want := "runsc version " + strings.TrimSpace(string(stamp))
	if got, _, _ := strings.Cut(string(out), "\n"); got != want {
		t.Fatalf("%s says %q, not %q: run scripts/setup.sh (it builds runsc with precompiled seccomp filters)", rs.Path, got, want)
	}
	for _, network := range []string{"none", "host"} {
		root, logs := t.TempDir(), t.TempDir()+"/"
		cmd := exec.Command(rs.Path, "--root", root, "--network="+network, "--debug", "--debug-log="+logs, "do", "/bin/true")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("runsc --network=%s do /bin/true: %v: %s", network, err, b)
		}
		for _, part := range []string{"boot", "gofer"} {
			files, _ := filepath.Glob(logs + "*." + part + ".txt")
			if len(files) != 1 {
				t.Fatalf("network %s: %s logs %v", network, part, files)
			}
			b, err := os.ReadFile(files[0])
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), "Loaded precompiled seccomp instructions") || strings.Contains(string(b), "No precompiled program found") {
				t.Fatalf("network %s: the %s did not load a precompiled seccomp program:\n%s", network, part, grepSeccomp(b))
			}
		}
	}
}

// grepSeccomp returns the lines of a runsc log about seccomp.
func grepSeccomp(b []byte) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(strings.ToLower(l), "seccomp") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
