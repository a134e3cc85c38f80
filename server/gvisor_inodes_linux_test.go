package server_test

import (
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// TestE2EGVisorInodeLimit: a live gvisor sandbox's /workspace and /tmp
// carry the policy's inode limit (runsc drops nr_inodes from OCI mounts,
// so the agent mounts them itself inside gVisor and then drops to a uid of
// its own with kill, setuid and setgid): a flood of empty files ends with
// ENOSPC at the limit, not with the sandbox OOM-killed. From the host: no
// OOM kill in the sandbox's cgroup, its processes are still there, and it
// answers the next exec. Inside, the agent (PID 1) has no other
// capability, and `enforced` says the inode limit holds.
func TestE2EGVisorInodeLimit(t *testing.T) {
	_, key, s, sb := gvisorSandbox(t)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	inodes := "missing"
	for _, l := range sb.Enforced {
		if l.Name == "inodes" {
			inodes = l.State
		}
	}
	if inodes != "ok" {
		t.Fatalf("inodes layer %s in %+v", inodes, sb.Enforced)
	}
	flood := `import os
i = 0
try:
    while True:
        open(f"/workspace/f{i}", "w").close()
        i += 1
except OSError as e:
    print(i, e.errno)
`
	if _, err := c.WriteFile(ctx, sb.ID, "/tmp/flood.py", strings.NewReader(flood), 0); err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"python3", "/tmp/flood.py"}, Timeout: 120})
	// strict: 16384 inodes, one of them the directory itself; ENOSPC is 28.
	if err != nil || res.Status != "ok" || res.Stdout != "16383 28\n" {
		t.Fatalf("file flood: %+v %v, want ENOSPC after 16383 files", res, err)
	}
	m, err := c.Metrics(ctx, sb.ID)
	if err != nil || m.OOMKills != 0 {
		t.Fatalf("metrics after the flood: %+v %v, want no OOM kill", m, err)
	}
	if pids := pidsInCgroup(t, sb.ID); len(pids) == 0 {
		t.Fatal("no process left in the sandbox's cgroup after the flood")
	}
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "grep -E '^Cap(Prm|Eff|Bnd|Amb):' /proc/1/status; grep -c nr_inodes=16384 /proc/mounts"})
	// The agent keeps kill, setuid and setgid (and dac_override permitted,
	// effective on its spawner thread only), with empty bounding and
	// ambient sets (issue 29: it runs as a uid of its own).
	// /proc/1/status shows the thread-group leader: e0, or e2 when the
	// leader is the spawner thread (dac_override is permitted to every
	// thread of the agent anyway; what matters is the permitted, bounding
	// and ambient sets).
	// Three tmpfs mounts carry the inode cap: /workspace, /tmp and the
	// workspace's second mount at /home/user (E2B's home, --workspace-bind).
	want := "CapPrm:\t00000000000000e2\nCapEff:\t00000000000000e0\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n3\n"
	spawner := strings.Replace(want, "CapEff:\t00000000000000e0", "CapEff:\t00000000000000e2", 1)
	if err != nil || res.Status != "ok" || (res.Stdout != want && res.Stdout != spawner) {
		t.Fatalf("agent capabilities and mounts: %+v %v", res, err)
	}
}
