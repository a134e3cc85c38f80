package agent

import (
	"strings"
	"testing"
)

// TestMountTmpfsRefusesBadArguments: without "--tmpfs" nothing happens;
// a malformed one, an unknown option or a relative "--workspace-bind" is
// an error before anything is mounted (the agent then exits: no sandbox
// without its limits or its layout).
func TestMountTmpfsRefusesBadArguments(t *testing.T) {
	if err := mountTmpfs([]string{"__agent", "--user", "1000:1000"}); err != nil {
		t.Fatalf("no --tmpfs: %v", err)
	}
	for arg, want := range map[string]string{
		"--tmpfs=workspace=size=1k":          "want TARGET=OPTIONS",
		"--tmpfs=/workspace":                 "want TARGET=OPTIONS",
		"--tmpfs=/workspace=size=1k,suid_ok": "unknown option",
		"--workspace-bind=home/user":         "want an absolute path",
		"--workspace-bind=":                  "want an absolute path",
	} {
		if err := mountTmpfs([]string{"__agent", arg}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", arg, err, want)
		}
	}
}

// TestAgentArgumentsRefused: a malformed --agent-id or --workload-cgroup,
// or an agent id that is root's or the workload's, is an error before the
// agent changes anything (it then exits: no sandbox without its identity
// or its limits).
func TestAgentArgumentsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--agent-id=x", "--user", "1000:1000"},
		{"--agent-id=-1", "--user", "1000:1000"},
		{"--agent-id=0", "--user", "1000:1000"},
		{"--agent-id=1000", "--user", "1000:1000"},
		{"--agent-id=65532"},
		{"--agent-id=65532", "--user", "0:0"},
	} {
		if err := mountTmpfs(append([]string{"__agent"}, args...)); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
	for _, arg := range []string{"--workload-cgroup=", "--workload-cgroup=1", "--workload-cgroup=0:64", "--workload-cgroup=1024:-1", "--workload-cgroup=a:b"} {
		if err := setupWorkloadCgroup([]string{"__agent", arg}); err == nil || !strings.Contains(err.Error(), "bad --workload-cgroup") {
			t.Errorf("%s: %v, want refused", arg, err)
		}
	}
	if err := setupWorkloadCgroup([]string{"__agent"}); err != nil || theWorkload != nil {
		t.Errorf("no --workload-cgroup: %v", err)
	}
}
