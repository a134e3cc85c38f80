package server_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"airlock/client"
	"airlock/store"
)

// TestE2EStateDirLocked: a second `airlock serve` on the same state
// directory is refused, naming the first one's pid, and leaves the first
// one's sandbox working.
func TestE2EStateDirLocked(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "lock")
	s1 := startServer(t, state)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, airlockBin(t), "serve", "--listen", "127.0.0.1:0", "--state-dir", state)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("second server on %s started: %s", state, out)
	}
	if want := "in use by process " + strconv.Itoa(s1.Pid()); !strings.Contains(string(out), want) {
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
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "shutdown")
	s1 := startServer(t, state)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	s1.stop(t)
	st, err := store.Open(state)
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
