package gvisor

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLdflagsVersion: the version of a runsc built by
// scripts/runsc-seccomp/build.sh is read from its -ldflags, without the
// build suffix; other -ldflags give none.
func TestLdflagsVersion(t *testing.T) {
	for in, want := range map[string]string{
		"-X gvisor.dev/gvisor/runsc/version.version=" + Version + "+airlock-seccomp.0123456789ab":      Version,
		"-s -X gvisor.dev/gvisor/runsc/version.version=" + Version + " -X main.other=1":                Version,
		"-X 'gvisor.dev/gvisor/runsc/version.version=" + Version + "+airlock-seccomp.0123456789ab' -w": Version,
		"-X main.version=1.0": "",
		"":                    "",
	} {
		if got := ldflagsVersion(in); got != want {
			t.Errorf("ldflagsVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestFindReadsSetupBuildVersion: a runsc built by setup (its --version has
// the +airlock-seccomp stamp) is reported as the pinned version, not as the
// (devel) of a build from a copy of the module.
func TestFindReadsSetupBuildVersion(t *testing.T) {
	rs, err := Find()
	if err != nil {
		t.Skip(err)
	}
	out, err := exec.Command(rs.Path, "--version").Output()
	if err != nil || !strings.Contains(string(out), "+airlock-seccomp.") {
		t.Skipf("%s is not setup's build (%q, %v)", rs.Path, out, err)
	}
	if rs.Version != Version {
		t.Fatalf("Find: version %q, want %q (runsc --version: %q)", rs.Version, Version, out)
	}
}
