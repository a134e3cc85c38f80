package server_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/store"
)

// TestE2EFullDisk: with the state directory's file system full, actions
// whose audit record cannot be written are refused (507, naming the
// directory) and do not happen; a kill is answered and eventually stored
// as killed, with its audit record; a server starting on the full disk
// says so.
func TestE2EFullDisk(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	testserver.MountTmpfs(t, state, "24m")
	key := newKey(t, state, "full")
	s1 := startServer(t, state)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	victim, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	filler := testserver.FillDisk(t, state)

	wantFull := func(what string, err error) {
		t.Helper()
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != 507 || !strings.Contains(ce.Message, "no space left on device: "+state) {
			t.Fatalf("%s on a full disk: %v, want 507 naming %s", what, err, state)
		}
	}
	_, err = c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "touch /workspace/ran-exec"})
	wantFull("exec", err)
	_, err = c.WriteFile(ctx, sb.ID, "ran-write", strings.NewReader("x"), 0)
	wantFull("file write", err)
	_, err = c.RunCode(ctx, sb.ID, client.CodeRequest{Language: "bash", Code: "touch /workspace/ran-code"})
	wantFull("code", err)

	_, err = c.Create(ctx, client.CreateRequest{Timeout: 600})
	wantFull("create", err)
	_, err = c.SetTimeout(ctx, sb.ID, time.Hour)
	wantFull("timeout", err)

	if err := c.Kill(ctx, victim.ID); err != nil {
		t.Fatalf("kill on a full disk: %v", err)
	}
	if got, err := c.Get(ctx, victim.ID); err != nil || got.State != "killed" {
		t.Fatalf("sandbox after a kill on a full disk: %+v %v", got, err)
	}
	if _, err := c.Exec(ctx, victim.ID, client.ExecRequest{Argv: []string{"true"}}); client.StatusOf(err) != 409 || !strings.Contains(err.Error(), "not running: killed") {
		t.Fatalf("exec in the sandbox killed on a full disk: %v", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ran-exec", "ran-write", "ran-code"} {
		if _, err := c.Stat(ctx, sb.ID, f); client.StatusOf(err) != 404 {
			t.Errorf("%s exists (stat: %v): a refused action happened", f, err)
		}
	}
	eventually(t, 30*time.Second, "the kill is stored and audited", func() bool {
		if storedRecord(t, state, victim.ID).State != store.StateKilled {
			return false
		}
		for _, ev := range auditOf(t, state, victim.ID) {
			if ev.Action == store.ActionSandboxKill {
				return true
			}
		}
		return false
	})

	s1.stop(t)
	testserver.FillDisk(t, state)
	if out := refusedServe(t, state); !strings.Contains(out, "no space left on device: "+state) {
		t.Fatalf("serve on a full disk: %s", out)
	}
}
