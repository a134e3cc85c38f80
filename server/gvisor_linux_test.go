package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestE2ECrashRecoveryGVisor: a running gvisor sandbox survives a server
// crash (TestE2EGVisorRunningSurvivesCrash), but one whose processes die
// while the server is down is recorded lost by the restarted server, and
// nothing of it is left: no runsc, sentry or gofer, no cgroup in any
// hierarchy, no bundle, no pinned network namespace, no runsc state.
func TestE2ECrashRecoveryGVisor(t *testing.T) {
	state, key, s1, sb := gvisorSandbox(t)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	if _, err := c.Start(ctx, sb.ID, client.ExecRequest{Shell: "sleep 600"}); err != nil {
		t.Fatal(err)
	}
	pid := initPid(t, state, sb.ID)
	s1.crash()
	for _, p := range append(pidsInCgroup(t, sb.ID), pid) {
		syscall.Kill(p, syscall.SIGKILL)
	}
	eventually(t, 15*time.Second, "the sandbox's runsc dies", func() bool { return !alive(pid) })

	s2 := startServer(t, state)
	c = client.New(s2.URL, key)
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.State != "lost" || !strings.Contains(got.EndReason, "gvisor") {
		t.Fatalf("gvisor sandbox after restart: %+v %v", got, err)
	}
	assertGone(t, state, sb.ID, pid)
	eventually(t, 15*time.Second, "no process of the sandbox left", func() bool { return !hostHasArg(sb.ID) })
	for _, p := range []string{filepath.Join(gvisor.StateBase, "bundles", sb.ID), filepath.Join(gvisor.StateBase, "root", "*"+sb.ID+"*"),
		filepath.Join(gvisor.StateBase, "netns", sb.ID)} {
		if m, _ := filepath.Glob(p); len(m) > 0 {
			t.Errorf("left behind: %v", m)
		}
	}
}

// hostHasArg reports whether a host process has arg in its command line
// (runsc boot and gofer carry the sandbox id).
func hostHasArg(arg string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), arg) {
			return true
		}
	}
	return false
}
