package server_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// gvisorBoundary is boundaryServer for the gvisor tier (skipped where
// runsc is not available).
func gvisorBoundary(t *testing.T, name string) *bserver {
	t.Helper()
	needRoot(t)
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	return boundaryServer(t, name)
}

// TestGVisorAgentOutOfReach (issue 29, item 4): under gVisor the workload
// can neither prlimit, signal, trace nor read the agent (PID 1 inside the
// sentry): the agent runs with real and saved uid 65532, not the
// workload's 1000. Before, both were uid 1000 and RLIMIT_NOFILE 3 set on
// the agent broke every later exec. Every later exec works, and the files
// the agent writes still belong to the workload's user.
func TestGVisorAgentOutOfReach(t *testing.T) {
	b := gvisorBoundary(t, "gvreach")
	c, ctx := b.c, b.ctx
	sb, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.ID)
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", reachAgentPy}, Timeout: 60})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "prlimit") || !strings.Contains(res.Stdout, "kill-STOP") {
		t.Fatalf("probe did not run: %+v", res)
	}
	t.Logf("probe: %s", res.Stdout)
	for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		if strings.HasSuffix(line, " ok") {
			t.Errorf("the workload reached the agent: %s", line)
		}
	}
	// Nor can it leave its cgroup, move the agent into it, or raise its
	// limits: the groups' files belong to root.
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Shell: `for w in "$$:/sys/fs/cgroup/cgroup.procs" "1:/sys/fs/cgroup/workload/cgroup.procs" "max:/sys/fs/cgroup/workload/pids.max" "max:/sys/fs/cgroup/workload/memory.max"; do (echo "${w%%:*}" > "${w#*:}") 2>/dev/null && echo "wrote ${w#*:}"; done; cat /proc/self/cgroup; echo done`})
	if err != nil || !strings.HasSuffix(res.Stdout, "0::/workload\ndone\n") || strings.Contains(res.Stdout, "wrote") {
		t.Errorf("the workload changed its cgroups: %+v %v", res, err)
	}
	// The agent serves on, with every limit it had: several execs, each
	// opening more than 3 files.
	for i := 0; i < 3; i++ {
		r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "cat /etc/hostname /etc/passwd /proc/self/status >/dev/null && echo alive"})
		if err != nil || strings.TrimSpace(r.Stdout) != "alive" {
			t.Fatalf("exec %d after the probe: %+v %v", i, r, err)
		}
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/workspace/owned", strings.NewReader("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "stat -c %u:%g /workspace/owned; id -u; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; grep -E '^(Uid|Gid):' /proc/1/status"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Stdout, "1000:1000\n1000\n") || strings.Count(res.Stdout, "0000000000000000") != 5 {
		t.Errorf("workload identity: %q, want files and processes of 1000:1000 with no capabilities", res.Stdout)
	}
	// Inside the sentry, the agent's real and saved ids are its own.
	seen := 0
	for _, l := range strings.Split(res.Stdout, "\n") {
		if f := strings.Fields(l); len(f) == 5 && (f[0] == "Uid:" || f[0] == "Gid:") {
			seen++
			if f[1] != "65532" || f[2] != "1000" || f[3] != "65532" {
				t.Errorf("agent %s, want real and saved 65532, effective 1000", l)
			}
		}
	}
	if seen != 2 {
		t.Errorf("the agent's Uid and Gid lines: %q", res.Stdout)
	}
}

// gvisorBombSandbox makes a gvisor sandbox with state worth keeping: a
// file, a code context with a variable, a background process. check
// verifies that all of it is still there and that the sandbox serves.
func gvisorBombSandbox(t *testing.T, b *bserver, limits *client.Limits) (id string, check func(what string)) {
	t.Helper()
	c, ctx := b.c, b.ctx
	sb, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Limits: limits, Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.ID) })
	if _, err := c.WriteFile(ctx, sb.ID, "/workspace/keep", strings.NewReader("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	cc, err := c.CreateContext(ctx, sb.ID, client.ContextRequest{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c.RunCode(ctx, sb.ID, client.CodeRequest{Code: "kept = 41 + 1", ContextID: cc.ID}); err != nil || r.Error != nil {
		t.Fatalf("code: %+v %v", r, err)
	}
	bg, err := c.Start(ctx, sb.ID, client.ExecRequest{Argv: []string{"sleep", "3600"}, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	return sb.ID, func(what string) {
		t.Helper()
		got, err := c.Get(ctx, sb.ID)
		if err != nil || got.State != "running" {
			t.Fatalf("%s: sandbox %+v %v, want running", what, got, err)
		}
		execAlive(t, c, ctx, sb.ID, what)
		if kept, err := c.ReadFile(ctx, sb.ID, "/workspace/keep"); err != nil || string(kept) != "kept" {
			t.Errorf("%s: file: %q %v", what, kept, err)
		}
		if r, err := c.RunCode(ctx, sb.ID, client.CodeRequest{Code: "kept", ContextID: cc.ID}); err != nil || r.Text != "42" {
			t.Errorf("%s: the context's variable: %+v %v", what, r, err)
		}
		ps, err := c.Processes(ctx, sb.ID)
		found := false
		for _, p := range ps {
			found = found || (p.Pid == bg && p.Running)
		}
		if err != nil || !found {
			t.Errorf("%s: background process %d gone: %+v %v", what, bg, ps, err)
		}
	}
}

// TestGVisorWorkloadOOMSandboxSurvives (issue 29, item 5): a memory bomb
// in a gvisor sandbox ends as status oom (exec, streamed exec, code cell),
// and the sandbox lives on with its files, its code context's variables
// and its background processes. Before, the host's OOM killer killed the
// sentry: exec answered status error, the cell 500, the sandbox exited.
func TestGVisorWorkloadOOMSandboxSurvives(t *testing.T) {
	b := gvisorBoundary(t, "gvoom")
	c, ctx := b.c, b.ctx
	id, check := gvisorBombSandbox(t, b, &client.Limits{MemoryBytes: 512 << 20})
	const hog = "x = b'x' * (2 << 30)"
	res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", hog}, Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != "oom" {
		t.Errorf("exec of a memory hog: %+v, want status oom", res)
	}
	check("after the exec's memory bomb")
	if got := execStreamStatus(t, c, ctx, id, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", "x = []\nwhile True: x.append(b'y' * (64 << 20))"}, Timeout: 120}); got != "oom" {
		t.Errorf("streamed exec of a memory hog: exit status %q, want oom", got)
	}
	check("after the streamed memory bomb")
	cell, err := c.RunCode(ctx, id, client.CodeRequest{Code: hog, Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if cell.Status != "oom" {
		t.Errorf("code cell of a memory hog: %+v, want status oom", cell)
	}
	check("after the cell's memory bomb")
}

// forkBombPy forks for 20 s, taking every pid slot that comes free; the
// children become sleep processes that hold their slots until then. (A
// bomb of python3 processes meets the memory limit first under gVisor,
// whose copy on write copies more than Linux's: its largest process is
// then killed.)
const forkBombPy = `
import os, time
end = time.time() + 20
while time.time() < end:
    try:
        pid = os.fork()
    except OSError:
        time.sleep(0.005)
        continue
    if pid == 0:
        try:
            os.execv("/bin/sleep", ["sleep", str(max(1, int(end - time.time())))])
        finally:
            os._exit(0)
`

// TestGVisorForkBombSandboxSurvives (issue 29, item 5): a fork bomb in a
// gvisor sandbox meets the workload's pids limit inside the sentry: while
// it holds every slot an exec answers 429 limit_reached, and the sandbox
// lives on with its files, its context's variables and its background
// processes. Before, the host's pids limit stopped the sentry itself and
// the sandbox exited. With the default pids limit and with pids 64.
func TestGVisorForkBombSandboxSurvives(t *testing.T) {
	b := gvisorBoundary(t, "gvfork")
	c, ctx := b.c, b.ctx
	for _, lim := range []*client.Limits{nil, {Pids: 64}} {
		id, check := gvisorBombSandbox(t, b, lim)
		bomb, err := c.Start(ctx, id, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", forkBombPy}, Background: true})
		if err != nil {
			t.Fatal(err)
		}
		limited := false
		deadline := time.Now().Add(60 * time.Second)
		for !limited && time.Now().Before(deadline) {
			_, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"true"}})
			var apiErr *client.Error
			switch {
			case errors.As(err, &apiErr) && apiErr.Status == 429 && apiErr.Code == "limit_reached":
				limited = true
			case err != nil:
				t.Fatalf("exec during the fork bomb: %v", err)
			default:
				time.Sleep(50 * time.Millisecond)
			}
		}
		if !limited {
			t.Errorf("pids %+v: the fork bomb never filled the workload's pids", lim)
		}
		// The bomb forks for 20 s (a slot freed meanwhile is taken again at
		// once), then its processes exit: wait for its parent to end first.
		eventually(t, 120*time.Second, "the fork bomb's parent ends", func() bool {
			ps, err := c.Processes(ctx, id)
			if err != nil {
				return false
			}
			for _, p := range ps {
				if p.Pid == bomb && p.Running {
					return false
				}
			}
			return true
		})
		eventually(t, 120*time.Second, "exec after the fork bomb", func() bool {
			r, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"echo", "alive"}})
			return err == nil && strings.TrimSpace(r.Stdout) == "alive"
		})
		check("after the fork bomb")
	}
}

// execStreamStatus runs req as a streamed exec and returns the status of
// its exit event.
func execStreamStatus(t *testing.T, c *client.Client, ctx context.Context, id string, req client.ExecRequest) string {
	t.Helper()
	st, err := c.ExecStream(ctx, id, req)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for {
		ev, err := st.Next()
		if err != nil {
			t.Fatalf("exec stream ended without an exit: %v", err)
		}
		if ev.Type == "exit" {
			return ev.Status
		}
	}
}

// TestGVisorNetworkPairsLive (issue 29, item 6): gvisor sandboxes with
// network created back to back, in pairs, all stay up; and whatever goes
// wrong is logged: every failed create leaves a server log line with the
// sandbox id and the reason, and every sandbox that ends without being
// killed a line with its id, runsc's exit and the agent's last words.
// AIRLOCK_GVISOR_PAIRS sets the number of pairs (default 4; the issue's
// reproduction used 30).
func TestGVisorNetworkPairsLive(t *testing.T) {
	b := gvisorBoundary(t, "gvpairs")
	c, ctx := b.c, b.ctx
	pairs := 4
	if v, err := strconv.Atoi(os.Getenv("AIRLOCK_GVISOR_PAIRS")); err == nil && v > 0 {
		pairs = v
	}
	var created, failed, died int
	for i := 0; i < pairs; i++ {
		var ids []string
		for j := 0; j < 2; j++ {
			sb, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Timeout: 300, Network: &client.Network{Mode: "open"}})
			if err != nil {
				failed++
				t.Errorf("pair %d: create %d: %v", i, j, err)
				continue
			}
			created++
			ids = append(ids, sb.ID)
		}
		// The first one of the pair ended about 0.3 s after the second's
		// create: give it time to.
		time.Sleep(time.Second)
		for _, id := range ids {
			got, err := c.Get(ctx, id)
			if err != nil || got.State != "running" {
				died++
				t.Errorf("pair %d: sandbox %s: %+v %v", i, id, got, err)
				if !strings.Contains(b.s.ReadLog(), "sandbox "+id+": ended: ") {
					t.Errorf("sandbox %s ended with no log line saying why", id)
				}
				continue
			}
			if r, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"echo", "alive"}}); err != nil || strings.TrimSpace(r.Stdout) != "alive" {
				t.Errorf("pair %d: exec in %s: %+v %v", i, id, r, err)
			}
			c.Kill(ctx, id)
		}
	}
	log := b.s.ReadLog()
	if n := strings.Count(log, ": create failed: "); n < failed {
		t.Errorf("%d creates failed, %d logged", failed, n)
	}
	t.Logf("%d pairs: %d created, %d failed, %d ended early", pairs, created, failed, died)
}
