package server_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/native/idrange"
)

// hostRange reads a sandbox's host uid range from the host: the first line
// of its init's /proc/PID/uid_map, "0 BASE COUNT".
func hostRange(t *testing.T, pid int) (base, count int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		t.Fatalf("uid_map of %d: %q", pid, b)
	}
	base, _ = strconv.Atoi(f[1])
	count, _ = strconv.Atoi(f[2])
	return base, count
}

// inotifyHoldPy takes up to N inotify instances, writes how many it got to
// /tmp/inotify.count, and keeps them.
const inotifyHoldPy = `import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
for _ in range(int(sys.argv[1])):
    if libc.inotify_init() < 0:
        break
    n += 1
open("/tmp/inotify.count.tmp", "w").write(str(n))
import os; os.rename("/tmp/inotify.count.tmp", "/tmp/inotify.count")
time.sleep(600)
`

// holdInotifyIn starts the holder in a live sandbox and returns its count.
func holdInotifyIn(t *testing.T, c *client.Client, id string, n int) int {
	t.Helper()
	ctx := ctxT(t)
	if _, err := c.WriteFile(ctx, id, "/tmp/hold.py", strings.NewReader(inotifyHoldPy), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, id, client.ExecRequest{Argv: []string{"/usr/bin/python3", "/tmp/hold.py", strconv.Itoa(n)}}); err != nil {
		t.Fatal(err)
	}
	var got string
	eventually(t, 30*time.Second, "inotify holder reports", func() bool {
		res, err := c.Exec(ctx, id, client.ExecRequest{Shell: "cat /tmp/inotify.count 2>/dev/null"})
		got = ""
		if err == nil {
			got = res.Stdout
		}
		return got != ""
	})
	k, err := strconv.Atoi(strings.TrimSpace(got))
	if err != nil {
		t.Fatalf("count %q", got)
	}
	return k
}

// TestLiveSandboxOwnIDRange (issue 20, finding 4) for live sandboxes: two
// sandboxes of one server run on disjoint host id ranges (read from the
// host), one holding every inotify instance its user may have leaves the
// other able to create one, a deleted sandbox's range is free again, and
// a sandbox reattached after a server crash keeps its range.
func TestLiveSandboxOwnIDRange(t *testing.T) {
	needRoot(t)
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances")
	if err != nil {
		t.Fatal(err)
	}
	limit, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if limit <= 0 || limit > 900 {
		t.Skipf("max_user_instances %q: not a limit a test can exhaust", b)
	}
	state := stateDir(t)
	key := newKey(t, state, "tenant")
	s1 := startServer(t, state)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	for _, prof := range []string{"strict", "standard", "light"} {
		t.Run(prof, func(t *testing.T) {
			a, err := c.Create(ctx, client.CreateRequest{Profile: prof, Timeout: 300})
			if err != nil {
				t.Fatal(err)
			}
			bb, err := c.Create(ctx, client.CreateRequest{Profile: prof, Timeout: 300})
			if err != nil {
				t.Fatal(err)
			}
			pidA := initPid(t, state, a.ID)
			baseA, nA := hostRange(t, pidA)
			baseB, nB := hostRange(t, initPid(t, state, bb.ID))
			if nA != idrange.Size || nB != idrange.Size || baseA == 0 || baseB == 0 {
				t.Fatalf("uid maps: %d+%d and %d+%d", baseA, nA, baseB, nB)
			}
			if ua, ub := statusUID(t, initPid(t, state, a.ID)), statusUID(t, initPid(t, state, bb.ID)); ua == ub || ua < baseA || ub < baseB {
				t.Errorf("host uids of the two agents (/proc/PID/status): %d and %d", ua, ub)
			}
			if baseA < baseB+nB && baseB < baseA+nA {
				t.Errorf("live sandboxes share host ids: %d+%d and %d+%d", baseA, nA, baseB, nB)
			}
			if got := holdInotifyIn(t, c, a.ID, limit+1); got != limit {
				t.Fatalf("sandbox A got %d inotify instances, want the per-user limit %d", got, limit)
			}
			if got := holdInotifyIn(t, c, bb.ID, 1); got != 1 {
				t.Errorf("sandbox B could not create an inotify instance while A holds %d", limit)
			}
			// Deleted: its range is free host-wide.
			if err := c.Kill(ctx, a.ID); err != nil {
				t.Fatal(err)
			}
			pool, err := idrange.Default()
			if err != nil {
				t.Fatal(err)
			}
			// Another package's sandboxes (go test -p) may lease the
			// range as soon as it is free: what must be gone is A's
			// hold on it.
			if b, err := os.ReadFile(filepath.Join(pool.Dir, strconv.Itoa(baseA))); err == nil {
				if f := strings.Fields(string(b)); len(f) > 0 && f[0] == strconv.Itoa(pidA) {
					t.Fatalf("range %d of deleted sandbox A is still leased to its init %d", baseA, pidA)
				}
			} else if !os.IsNotExist(err) {
				t.Fatal(err)
			}
			c.Kill(ctx, bb.ID)
		})
	}

	// A reattached sandbox keeps its range, and it stays taken.
	keep, err := c.Create(ctx, client.CreateRequest{Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	pid := initPid(t, state, keep.ID)
	base, _ := hostRange(t, pid)
	s1.crash()
	s2 := startServer(t, state)
	c = client.New(s2.URL, key)
	got, err := c.Get(ctx, keep.ID)
	if err != nil || got.State != "running" || !got.Reattached {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if b2, _ := hostRange(t, pid); b2 != base {
		t.Fatalf("range changed across the restart: %d -> %d", base, b2)
	}
	pool, _ := idrange.Default()
	if _, err := pool.Acquire(os.Getpid(), base, nil); err == nil {
		t.Fatal("range of a reattached sandbox was free for the taking")
	}
	other, err := c.Create(ctx, client.CreateRequest{Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	if ob, _ := hostRange(t, initPid(t, state, other.ID)); ob == base {
		t.Fatalf("new sandbox got the reattached sandbox's range %d", base)
	}
}

// statusUID is the real uid of pid as the host sees it (/proc/PID/status).
func statusUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				return n
			}
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return 0
}

// TestTwoServersDisjointRanges: two servers with different state dirs on
// one host never hand out overlapping host id ranges, nor do they overlap
// a one-shot sandbox's.
func TestTwoServersDisjointRanges(t *testing.T) {
	needRoot(t)
	ctx := ctxT(t)
	type rng struct{ base, n int }
	var got []rng
	for i := 0; i < 2; i++ {
		state := stateDir(t)
		key := newKey(t, state, "twin")
		c := client.New(startServer(t, state).URL, key)
		for j := 0; j < 2; j++ {
			sb, err := c.Create(ctx, client.CreateRequest{Timeout: 120})
			if err != nil {
				t.Fatal(err)
			}
			b, n := hostRange(t, initPid(t, state, sb.ID))
			got = append(got, rng{b, n})
		}
	}
	for i := range got {
		for j := i + 1; j < len(got); j++ {
			if got[i].base < got[j].base+got[j].n && got[j].base < got[i].base+got[i].n {
				t.Errorf("sandboxes of two servers share host ids: %+v and %+v", got[i], got[j])
			}
		}
	}
}
