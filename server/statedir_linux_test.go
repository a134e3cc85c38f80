package server_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/store"
)

// TestE2EStateDirLocked: a second `airlock serve` on the same state
// directory is refused, naming the first one's pid, and leaves the first
// one's sandbox working.
func TestE2EStateDirLocked(t *testing.T) {
	e := newE2E(t, "lock")
	state, s1, c, ctx := e.state, e.s, e.c, e.ctx
	sb := e.sandbox(t, client.CreateRequest{})
	out := refusedServe(t, state)
	if want := "in use by process " + strconv.Itoa(s1.Pid()); !strings.Contains(out, want) {
		t.Fatalf("second server's error %q does not contain %q", out, want)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "echo still-mine"})
	if err != nil || res.Stdout != "still-mine\n" {
		t.Fatalf("first server's sandbox after the refused second server: %+v %v", res, err)
	}
	// Once the first server is gone, the directory is free again.
	s1.stop(t)
	startServer(t, state)
}

// TestE2EShutdownKillsAudited: the kills a graceful shutdown makes are in
// the audit log.
func TestE2EShutdownKillsAudited(t *testing.T) {
	e := newE2E(t, "shutdown")
	sb := e.sandbox(t, client.CreateRequest{})
	e.s.stop(t)
	st, err := store.Open(e.state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs, err := st.AuditLog(context.Background(), store.AuditFilter{SandboxID: sb.ID, Action: store.ActionSandboxKill})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || !strings.Contains(string(evs[0].Detail), "shutdown") {
		t.Fatalf("audit of the shutdown kill of %s: %+v", sb.ID, evs)
	}
}

// TestE2EMetricsAfterRestart: a reattached sandbox's metrics come from its
// cgroup like a fresh one's (memory, peak, pids), not zeros.
func TestE2EMetricsAfterRestart(t *testing.T) {
	e := newE2E(t, "metrics", "--keep-on-shutdown")
	state, s1, c, ctx := e.state, e.s, e.c, e.ctx
	sb := e.sandbox(t, client.CreateRequest{Profile: "standard"})
	// 32 MiB in the tmpfs workspace is charged to the sandbox's memory.
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "head -c 33554432 /dev/zero > big"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("fill: %+v %v", res, err)
	}
	if _, err := c.Start(ctx, sb.ID, client.ExecRequest{Shell: "sleep 600"}); err != nil {
		t.Fatal(err)
	}
	before, err := c.Metrics(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	s1.stop(t)
	s2 := startServer(t, state)
	c = client.New(s2.URL, e.key)
	after, err := c.Metrics(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*client.Metrics{before, after} {
		if m.MemoryBytes < 32<<20 || m.PeakMemoryBytes < m.MemoryBytes || m.Pids < 2 {
			t.Fatalf("metrics before restart %+v, after %+v: want memory >= 32 MiB, peak >= memory, pids >= 2", before, after)
		}
	}
}

// TestE2ERevokeTakesEffectAtOnce: a key revoked with `airlock keys
// revoke` (another process) is refused by the running server at the next
// request, though the server had just verified (cached) it.
func TestE2ERevokeTakesEffectAtOnce(t *testing.T) {
	e := newE2E(t, "to-revoke")
	state, c, ctx := e.state, e.c, e.ctx
	if _, err := c.List(ctx, nil); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := st.ListKeys(ctx)
	st.Close()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys: %v %v", keys, err)
	}
	if out, err := exec.Command(airlockBin(t), "keys", "revoke", "--state-dir", state, keys[0].ID).CombinedOutput(); err != nil {
		t.Fatalf("keys revoke: %v %s", err, out)
	}
	if _, err := c.List(ctx, nil); client.StatusOf(err) != 401 {
		t.Fatalf("request with a revoked key: %v, want 401", err)
	}
}
