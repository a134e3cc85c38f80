package server_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestE2EGVisorPausedSurvivesRestart: a gvisor sandbox paused (checkpointed
// to disk) when the server is killed with SIGKILL comes back paused under
// the restarted server, and resume restores it from its image: a file of
// its tmpfs workspace, a Python variable and a background process are as
// they were, and new commands run. A running gvisor sandbox is still lost
// (TestE2ECrashRecoveryGVisor).
func TestE2EGVisorPausedSurvivesRestart(t *testing.T) {
	state, key, s1, sb := gvisorSandbox(t)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	seedKept(ctx, t, c, sb.ID)
	bg, err := c.Start(ctx, sb.ID, client.ExecRequest{Shell: "sleep 600", Tag: "bg"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s1.crash() // SIGKILL

	s2 := startServer(t, state)
	c = client.New(s2.URL, key)
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.State != "running" || !got.Paused || !got.Reattached {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume after restart: %v", err)
	}
	checkKept(ctx, t, c, sb.ID, "after resume")
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "pgrep -x sleep >/dev/null && echo alive"}); err != nil || res.Stdout != "alive\n" {
		t.Fatalf("background process %+v after resume: %+v %v", bg, res, err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// Killed, nothing of it is left on the host: no process, no bundle, no
	// runsc state, no state directory (with its checkpoint image).
	eventually(t, 15*time.Second, "no process of the sandbox left", func() bool { return !hostHasArg(sb.ID) })
	for _, p := range []string{filepath.Join(gvisor.StateBase, "bundles", sb.ID), filepath.Join(gvisor.StateBase, "root", "*"+sb.ID+"*"),
		filepath.Join(state, "sandboxes", sb.ID)} {
		if m, _ := filepath.Glob(p); len(m) > 0 {
			t.Errorf("left behind: %v", m)
		}
	}
}

// gvisorSandbox starts a server on a new state directory and a gvisor
// sandbox in it, and returns them with the key's secret; it skips without
// root or runsc. args are the server's extra flags.
func gvisorSandbox(t *testing.T, args ...string) (state, key string, s *srv, sb *client.Sandbox) {
	t.Helper()
	needRoot(t)
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	state = stateDir(t)
	key = newKey(t, state, "gvisor")
	s = startServer(t, state, args...)
	sb, err := client.New(s.URL, key).Create(ctxT(t), client.CreateRequest{Timeout: 600, Runtime: "gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	return state, key, s, sb
}
