package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// TestE2ECrashRecovery SIGKILLs the server with two sandboxes running,
// kills one sandbox's agent while the server is down, and restarts: the
// survivor is reattached (TTL kept, still execs, its background process
// still there), the other is recorded lost with nothing of it left.
func TestE2ECrashRecovery(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "crash")
	s1 := startServer(t, state)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)

	keep, err := c.Create(ctx, client.CreateRequest{Timeout: 600, Metadata: map[string]string{"role": "keep"}})
	if err != nil {
		t.Fatal(err)
	}
	lose, err := c.Create(ctx, client.CreateRequest{Timeout: 600, Metadata: map[string]string{"role": "lose"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, keep.ID, "state.txt", strings.NewReader("before crash\n"), 0); err != nil {
		t.Fatal(err)
	}
	bgPid, err := c.Start(ctx, keep.ID, client.ExecRequest{Shell: "echo bg-alive; sleep 600", Tag: "survivor"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, lose.ID, client.ExecRequest{Shell: "sleep 600"}); err != nil {
		t.Fatal(err)
	}
	keepPid := initPid(t, state, keep.ID)
	losePid := initPid(t, state, lose.ID)

	s1.crash()
	// The sandboxes outlive the server.
	if !alive(keepPid) || !alive(losePid) {
		t.Fatal("sandboxes died with the server")
	}
	// Kill one sandbox's agent while the server is down.
	if err := syscall.Kill(losePid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	s2 := startServer(t, state)
	c = client.New(s2.URL, key)
	got, err := c.Get(ctx, keep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != "running" || !got.Reattached || got.ExpiresAt == nil || !got.ExpiresAt.Equal(*keep.ExpiresAt) {
		t.Fatalf("survivor after restart: %+v (created %+v)", got, keep)
	}
	res, err := c.Exec(ctx, keep.ID, client.ExecRequest{Shell: "cat state.txt"})
	if err != nil || res.Stdout != "before crash\n" {
		t.Fatalf("exec in reattached sandbox: %+v %v", res, err)
	}
	procs, err := c.Processes(ctx, keep.ID)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range procs {
		found = found || (p.Pid == bgPid && p.Running)
	}
	if !found {
		t.Fatalf("background process %d lost across the restart: %+v", bgPid, procs)
	}
	at, err := c.Attach(ctx, keep.ID, bgPid)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := at.Next() // start
	for err == nil && ev.Type != "stdout" {
		ev, err = at.Next()
	}
	at.Close()
	if err != nil || string(ev.Data) != "bg-alive\n" {
		t.Fatalf("re-attach after restart: %+v %v", ev, err)
	}

	lost, err := c.Get(ctx, lose.ID)
	if err != nil || lost.State != "lost" || lost.EndReason == "" {
		t.Fatalf("killed sandbox after restart: %+v %v", lost, err)
	}
	assertGone(t, state, lose.ID, losePid)
	if _, err := c.Exec(ctx, lose.ID, client.ExecRequest{Argv: []string{"true"}}); client.StatusOf(err) != 409 {
		t.Fatalf("exec in lost sandbox: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(state, "sandboxes"))
	if len(ents) != 1 || ents[0].Name() != keep.ID {
		t.Fatalf("state dirs after recovery: %v", ents)
	}

	// A graceful stop kills the survivor too: nothing left.
	s2.stop(t)
	assertGone(t, state, keep.ID, keepPid)
}
