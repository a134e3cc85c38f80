package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// freezerState reads the sandbox's cgroup freezer state from the host.
func freezerState(t *testing.T, id string) string {
	t.Helper()
	for _, f := range []string{"/sys/fs/cgroup/freezer/airlock/" + id + "/freezer.state", "/sys/fs/cgroup/airlock/" + id + "/cgroup.freeze"} {
		if b, err := os.ReadFile(f); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("no freezer for sandbox %s", id)
	return ""
}

// cpuUsage reads the sandbox's cgroup CPU time (ns) from the host.
func cpuUsage(t *testing.T, id string) string {
	t.Helper()
	for _, f := range []string{"/sys/fs/cgroup/cpuacct/airlock/" + id + "/cpuacct.usage", "/sys/fs/cgroup/airlock/" + id + "/cpu.stat"} {
		if b, err := os.ReadFile(f); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("no cpu accounting for sandbox %s", id)
	return ""
}

// TestE2EPauseResume: pause stops every process of the sandbox (checked
// from the host: no CPU used by a spinning process; native: the freezer
// state; gvisor: checkpointed to disk, no task left and the memory freed),
// requests that need the agent answer 409 paused, resume brings back the
// same processes, files and Python variables; a paused sandbox can still
// be killed. Once per runtime.
func TestE2EPauseResume(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, runtime string) {
		state := stateDir(t)
		key := newKey(t, state, "pause")
		s := startServer(t, state, "--default-runtime", runtime)
		c := client.New(s.URL, key)
		ctx := ctxT(t)
		sb, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteFile(ctx, sb.ID, "kept.txt", strings.NewReader("kept\n"), 0); err != nil {
			t.Fatal(err)
		}
		spin, err := c.Start(ctx, sb.ID, client.ExecRequest{Shell: "while :; do :; done", Tag: "spin"})
		if err != nil {
			t.Fatal(err)
		}
		if res := runCell(t, c, sb.ID, client.CodeRequest{Code: "x = 41\nbig = bytearray(64 << 20)"}); res.Error != nil {
			t.Fatalf("cell: %+v", res.Error)
		}
		p, err := c.Pause(ctx, sb.ID)
		if err != nil || !p.Paused || p.State != "running" {
			t.Fatalf("pause: %+v %v", p, err)
		}
		if runtime == "gvisor" {
			// Checkpointed to disk: nothing of it runs, its memory is freed.
			mt, err := c.Metrics(ctx, sb.ID)
			if err != nil || mt.Pids != 0 || mt.MemoryBytes > 16<<20 {
				t.Fatalf("metrics of a checkpointed sandbox: %+v %v", mt, err)
			}
			if ents, err := os.ReadDir(filepath.Join(state, "sandboxes", sb.ID, "checkpoint")); err != nil || len(ents) == 0 {
				t.Fatalf("no checkpoint image: %v", err)
			}
		} else if st := freezerState(t, sb.ID); st != "FROZEN" && st != "1" {
			t.Fatalf("freezer state %q after pause", st)
		}
		before := cpuUsage(t, sb.ID)
		if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); client.StatusOf(err) != 409 || !strings.Contains(err.Error(), "paused") {
			t.Fatalf("exec in a paused sandbox: %v", err)
		}
		if again, err := c.Pause(ctx, sb.ID); err != nil || !again.Paused {
			t.Fatalf("second pause: %+v %v", again, err)
		}
		if after := cpuUsage(t, sb.ID); after != before {
			t.Fatalf("a paused sandbox used CPU: %s then %s", before, after)
		}
		if g, err := c.Get(ctx, sb.ID); err != nil || !g.Paused {
			t.Fatalf("get: %+v %v", g, err)
		}
		r, err := c.Resume(ctx, sb.ID)
		if err != nil || r.Paused {
			t.Fatalf("resume: %+v %v", r, err)
		}
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "cat kept.txt"})
		if err != nil || res.Stdout != "kept\n" {
			t.Fatalf("exec after resume: %+v %v", res, err)
		}
		procs, err := c.Processes(ctx, sb.ID)
		found := false
		for _, p := range procs {
			found = found || (p.Pid == spin && p.Running)
		}
		if err != nil || !found {
			t.Fatalf("spinner %d not running after resume: %+v %v", spin, procs, err)
		}
		if res := runCell(t, c, sb.ID, client.CodeRequest{Code: "x + 1, len(big)"}); res.Text != "(42, 67108864)" {
			t.Fatalf("python state after resume: %+v", res)
		}
		// A paused sandbox is killed like any other.
		if _, err := c.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		pid := initPid(t, state, sb.ID)
		if err := c.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		assertGone(t, state, sb.ID, pid)
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/freezer/airlock", sb.ID)); err == nil {
			t.Fatal("freezer cgroup left behind")
		}
	})
}

// TestE2EPausedThawedOnRestart: a native sandbox paused when the server
// crashed is thawed and reattached by the next server, not lost.
func TestE2EPausedThawedOnRestart(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "pause")
	s1 := startServer(t, state)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s1.crash()
	s2 := startServer(t, state)
	c = client.New(s2.URL, key)
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.State != "running" || !got.Reattached || got.Paused {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if st := freezerState(t, sb.ID); st != "THAWED" && st != "0" {
		t.Fatalf("freezer state %q after restart", st)
	}
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"echo", "back"}}); err != nil || res.Stdout != "back\n" {
		t.Fatalf("exec after restart: %+v %v", res, err)
	}
}
