package server_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestE2EGVisorAdoptedPausesAndSnapshots: a gvisor sandbox taken over
// running after a SIGKILL of the server (its agent now reached over TCP in
// its own network namespace) can be memory-snapshotted and forked, paused
// and resumed, like one the server started: its file, Python variable and
// background process are intact in the fork and after the resume, and the
// original keeps answering after the snapshot. Paused, it survives a second
// SIGKILL and resumes under the next server with its state intact. Killed,
// it leaves nothing on the host.
func TestE2EGVisorAdoptedPausesAndSnapshots(t *testing.T) {
	state, key, s1, sb := gvisorSandbox(t)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	seedKept(ctx, t, c, sb.ID)
	if _, err := c.Start(ctx, sb.ID, client.ExecRequest{Shell: "sleep 600", Tag: "bg"}); err != nil {
		t.Fatal(err)
	}
	intact := func(c *client.Client, id, when string) {
		t.Helper()
		checkKept(ctx, t, c, id, when)
		if res, err := c.Exec(ctx, id, client.ExecRequest{Shell: "pgrep -x sleep >/dev/null && echo alive"}); err != nil || res.Stdout != "alive\n" {
			t.Fatalf("%s: background process: %+v %v", when, res, err)
		}
	}
	s1.crash() // SIGKILL
	s2 := startServer(t, state)
	c = client.New(s2.URL, key)
	if got, err := c.Get(ctx, sb.ID); err != nil || got.State != "running" || !got.Reattached || got.Paused {
		t.Fatalf("after the restart: %+v %v", got, err)
	}
	intact(c, sb.ID, "adopted running")

	snap, err := c.MemorySnapshot(ctx, sb.ID)
	if err != nil {
		t.Fatalf("memory snapshot of an adopted sandbox: %v", err)
	}
	intact(c, sb.ID, "the original after its snapshot")
	f, err := c.Create(ctx, client.CreateRequest{Snapshot: snap.ID, Timeout: 600})
	if err != nil {
		t.Fatalf("fork of an adopted sandbox's snapshot: %v", err)
	}
	intact(c, f.ID, "the fork")
	// The fork's files are its own.
	if _, err := c.WriteFile(ctx, f.ID, "kept.txt", strings.NewReader("fork\n"), 0); err != nil {
		t.Fatal(err)
	}
	intact(c, sb.ID, "the original after the fork wrote")
	if err := c.Kill(ctx, f.ID); err != nil {
		t.Fatal(err)
	}

	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("pause of an adopted sandbox: %v", err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume of an adopted sandbox: %v", err)
	}
	intact(c, sb.ID, "after pause and resume")

	// Paused again, it survives a second SIGKILL: the next server adopts
	// it paused and reconnects to its agent over TCP on resume.
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s2.crash()
	s3 := startServer(t, state)
	c = client.New(s3.URL, key)
	if got, err := c.Get(ctx, sb.ID); err != nil || got.State != "running" || !got.Paused || !got.Reattached {
		t.Fatalf("after the second restart: %+v %v", got, err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume after the second restart: %v", err)
	}
	intact(c, sb.ID, "resumed after the second restart")

	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "no process of the sandboxes left", func() bool { return !hostHasArg(sb.ID) && !hostHasArg(f.ID) })
	for _, id := range []string{sb.ID, f.ID} {
		for _, p := range []string{filepath.Join(gvisor.StateBase, "bundles", id), filepath.Join(gvisor.StateBase, "root", "*"+id+"*"),
			filepath.Join(gvisor.StateBase, "netns", id), filepath.Join(state, "sandboxes", id)} {
			if m, _ := filepath.Glob(p); len(m) > 0 {
				t.Errorf("left behind: %v", m)
			}
		}
	}
}

// TestE2EGVisorKilledMidSnapshotAdopted: a server killed (SIGKILL) while a
// memory snapshot of an image sandbox holds it paused (runsc pause, made
// here from outside at that point) leaves it paused; the next server takes
// it over running again, its file and Python variable intact, instead of
// losing it to an agent that cannot answer.
func TestE2EGVisorKilledMidSnapshotAdopted(t *testing.T) {
	state, key, s1, sb := gvisorSandbox(t)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	seedKept(ctx, t, c, sb.ID)
	rs, err := gvisor.Available()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(rs.Path, "--root", filepath.Join(gvisor.StateBase, "root"), "pause", sb.ID).CombinedOutput(); err != nil {
		t.Fatalf("runsc pause: %v: %s", err, out)
	}
	s1.crash()
	s2 := startServer(t, state)
	c = client.New(s2.URL, key)
	if got, err := c.Get(ctx, sb.ID); err != nil || got.State != "running" || !got.Reattached {
		t.Fatalf("after the restart: %+v %v (server log: %s)", got, err, s2.ReadLog())
	}
	checkKept(ctx, t, c, sb.ID, "after the restart")
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "no process of the sandbox left", func() bool { return !hostHasArg(sb.ID) })
}

// TestCrashMidGVisorPauseAdopted is TestCrashMidGVisorPause for a sandbox
// taken over running after a first SIGKILL (its agent on TCP): a second
// SIGKILL while runsc checkpoints it for a pause leaves it paused under
// the third server, which resumes it, reconnecting to its agent, with its
// file and Python variable intact; killed, nothing of it is left.
func TestCrashMidGVisorPauseAdopted(t *testing.T) {
	state, key, s1, sb := gvisorSandbox(t)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	seedKept(ctx, t, c, sb.ID)
	s1.crash()
	s2 := startServer(t, state)
	c = client.New(s2.URL, key)
	if got, err := c.Get(ctx, sb.ID); err != nil || got.State != "running" || !got.Reattached {
		t.Fatalf("after the first restart: %+v %v", got, err)
	}
	paused := make(chan error, 1)
	go func() { _, err := c.Pause(ctx, sb.ID); paused <- err }()
	eventually(t, time.Minute, "runsc checkpoint of the sandbox runs", func() bool { return runscCheckpointOf(sb.ID) })
	s2.crash() // SIGKILL, mid checkpoint
	<-paused

	s3 := startServer(t, state)
	c = client.New(s3.URL, key)
	if got, err := c.Get(ctx, sb.ID); err != nil || got.State != "running" || !got.Paused || !got.Reattached {
		t.Fatalf("after a crash mid pause the adopted sandbox is %+v (%v), want it kept, paused", got, err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume after restart: %v", err)
	}
	checkKept(ctx, t, c, sb.ID, "after the crash")
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "no process of the sandbox left", func() bool { return !hostHasArg(sb.ID) })
	if m, _ := filepath.Glob(filepath.Join(state, "sandboxes", sb.ID)); len(m) > 0 {
		t.Errorf("the sandbox's directory (and its checkpoint) is left: %v", m)
	}
}
