package server_test

import (
	"context"
	"sync"
	"testing"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/store"
)

// TestAuditSurvivesKill: every exec whose answer reached the client has
// both its audit records (exec, exec.result) in the state database after
// the server is killed with SIGKILL right after the last answer: appends
// committed by their caller on an idle log (one client) and appends
// group-committed by the writer (several clients at once) alike.
func TestAuditSurvivesKill(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	s := startServer(t, state, "--no-auth")
	c := client.New(s.URL, "")
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	const serial, clients, each = 20, 4, 10
	answered := 0
	for range serial {
		if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/true"}}); err != nil {
			t.Fatal(err)
		}
		answered++
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range clients {
		wg.Go(func() {
			for range each {
				if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/true"}}); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				answered++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	s.crash() // SIGKILL: nothing is flushed on the way out
	if t.Failed() {
		return
	}

	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	for _, action := range []string{store.ActionExec, "exec.result"} {
		evs, err := st.AuditLog(context.Background(), store.AuditFilter{SandboxID: sb.ID, Action: action})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != answered {
			t.Errorf("%d %q records after the kill, want %d (one per answered exec)", len(evs), action, answered)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// Leave nothing behind: a new server reattaches the sandbox; kill it.
	s2 := startServer(t, state, "--no-auth")
	if err := client.New(s2.URL, "").Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
