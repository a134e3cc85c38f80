package cgroups

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFreezeThrottledGroup pauses a group whose busy tasks are throttled
// by a 0.01-CPU quota (1 ms per 100 ms period): a task must run to enter
// the freezer, so reaching FROZEN takes quota periods. Freeze must wait for
// it (a pause that fails kills the sandbox at the end of its TTL, losing
// its files) and Thaw must let the tasks run again.
func TestFreezeThrottledGroup(t *testing.T) {
	h := needHost(t)
	g := mustCreate(t, h, Limits{MemoryBytes: 64 * mib, CPUs: 0.01, Pids: 16})
	if g.freezerDir == "" {
		t.Fatal("no freezer on this host")
	}
	// Eight busy tasks share the 1 ms quota.
	p := startHeld(t, "for i in 1 2 3 4 5 6 7; do (while :; do :; done) & done; while :; do :; done")
	// The background loops hold the shell's stderr: end the whole group
	// before the shell's own cleanup waits for its output.
	t.Cleanup(func() { g.Thaw(); g.Destroy() })
	if err := g.Add(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	p.release(t)
	// Each fork needs the quota's CPU too: in an emulated guest on a
	// loaded host (the cgroup v2 guest in CI) 20 s was not enough.
	eventually(t, 3*time.Minute, "eight busy tasks in the group", func() bool {
		pids, err := g.procs()
		return err == nil && len(pids) == 8
	})
	for round := 0; round < 5; round++ {
		if err := g.Freeze(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		var b [256]byte
		file, want := g.freezerDir+"/freezer.state", "FROZEN"
		if g.version == 2 {
			file, want = g.freezerDir+"/cgroup.events", "frozen 1"
		}
		data, err := readSmall(file, b[:])
		if err != nil || !strings.Contains(string(data), want) {
			t.Fatalf("round %d: Freeze returned but %s says %q (%v)", round, file, data, err)
		}
		before := cpuTicks(t, p.cmd.Process.Pid)
		time.Sleep(300 * time.Millisecond)
		if after := cpuTicks(t, p.cmd.Process.Pid); after != before {
			t.Fatalf("round %d: a frozen task ran (%d -> %d ticks)", round, before, after)
		}
		if err := g.Thaw(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats after 5 freezes: %+v", st)
}

// cpuTicks is a process's user+system CPU time in clock ticks.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}
