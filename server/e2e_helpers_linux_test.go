package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/pgtest"
	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/store"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	pgtest.StopShared()
	os.Exit(code)
}

// The shared end-to-end helpers (internal/testserver), under this
// package's names.
var (
	airlockBin = testserver.Binary
	needRoot   = testserver.NeedRoot
	stateDir   = testserver.StateDir
)

// srv is a running `airlock serve`.
type srv struct{ *testserver.Server }

// startServer runs airlock serve on a free loopback port.
func startServer(t testing.TB, state string, args ...string) *srv {
	return &srv{testserver.Start(t, state, args...)}
}

func (s *srv) stop(testing.TB) { s.Stop() }
func (s *srv) crash()          { s.Crash() }

// newKey creates an API key with `airlock keys create`.
func newKey(t testing.TB, state, name string, extra ...string) string {
	t.Helper()
	secret := testserver.NewKey(t, state, name, extra...)
	if !strings.HasPrefix(secret, "al_") {
		t.Fatalf("keys create printed %q", secret)
	}
	return secret
}

// initPid reads a sandbox's init pid from the server's store.
func initPid(t testing.TB, state, id string) int {
	t.Helper()
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.InitPID <= 0 {
		t.Fatalf("sandbox %s has no init pid", id)
	}
	return rec.InitPID
}

// cgroupDirs lists the host cgroup directories named after id.
func cgroupDirs(id string) []string {
	var found []string
	for _, pat := range []string{"/sys/fs/cgroup/*/airlock/" + id, "/sys/fs/cgroup/airlock/" + id, "/sys/fs/cgroup/*/airlock/*/" + id} {
		m, _ := filepath.Glob(pat)
		found = append(found, m...)
	}
	return found
}

// alive reports whether pid is a live (non-zombie) process started at
// startTime (0: any).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	// A zombie has released everything; only its parent's wait is missing.
	return s[i+2] != 'Z'
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// assertGone checks from the host that nothing of a sandbox remains.
func assertGone(t testing.TB, state, id string, pid int) {
	t.Helper()
	eventually(t, 15*time.Second, "sandbox "+id+" init exits", func() bool { return !alive(pid) })
	eventually(t, 15*time.Second, "sandbox "+id+" cgroups removed", func() bool { return len(cgroupDirs(id)) == 0 })
	if _, err := os.Stat(filepath.Join(state, "sandboxes", id)); !os.IsNotExist(err) {
		t.Errorf("state dir of %s still exists (err %v)", id, err)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var _ = client.New

// seedKept leaves two kinds of state in sandbox id for a restart, pause or
// crash test to find again with checkKept: a workspace file (kept.txt) and
// a Python variable (x = 41) of the default context.
func seedKept(ctx context.Context, t *testing.T, c *client.Client, id string) {
	t.Helper()
	if _, err := c.WriteFile(ctx, id, "kept.txt", strings.NewReader("kept\n"), 0); err != nil {
		t.Fatal(err)
	}
	if res := runCell(t, c, id, client.CodeRequest{Code: "x = 41"}); res.Error != nil {
		t.Fatalf("cell: %+v", res.Error)
	}
}

// checkKept checks that what seedKept left in sandbox id is there, when
// (for example "after the restart") naming the moment in a failure.
func checkKept(ctx context.Context, t *testing.T, c *client.Client, id, when string) {
	t.Helper()
	if res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"cat", "kept.txt"}}); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("file %s: %+v %v", when, res, err)
	}
	if res := runCell(t, c, id, client.CodeRequest{Code: "x + 1"}); res.Error != nil || res.Text != "42" {
		t.Fatalf("Python variable %s: %+v", when, res)
	}
}
