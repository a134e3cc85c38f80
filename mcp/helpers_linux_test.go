package mcp_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/mcp"
	"github.com/airlock-dev/airlock/store"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}

// The shared end-to-end helpers (internal/testserver), under this
// package's names. The binary is also the agent of in-process managers.
var (
	airlockBin = testserver.Binary
	needRoot   = testserver.NeedRoot
	shortDir   = testserver.StateDir
)

// env is an in-process manager and MCP service.
type env struct {
	dir string
	st  *store.Store
	m   *manager.Manager
	svc *mcp.Service
}

func newEnv(t testing.TB, tweak func(*mcp.Config)) *env {
	t.Helper()
	return newEnvMax(t, 20, tweak)
}

// newEnvMax is newEnv with a manager running at most maxSandboxes.
func newEnvMax(t testing.TB, maxSandboxes int, tweak func(*mcp.Config)) *env {
	t.Helper()
	return newEnvFull(t, maxSandboxes, manager.EgressConfig{}, tweak)
}

// newEnvNet is newEnv with an egress configuration.
func newEnvNet(t testing.TB, ec manager.EgressConfig, tweak func(*mcp.Config)) *env {
	t.Helper()
	return newEnvFull(t, 20, ec, tweak)
}

func newEnvFull(t testing.TB, maxSandboxes int, ec manager.EgressConfig, tweak func(*mcp.Config)) *env {
	t.Helper()
	needRoot(t)
	return newEnvAt(t, shortDir(t), maxSandboxes, ec, tweak)
}

// newEnvAt is newEnvFull with the state in dir.
func newEnvAt(t testing.TB, dir string, maxSandboxes int, ec manager.EgressConfig, tweak func(*mcp.Config)) *env {
	t.Helper()
	return newEnvManager(t, dir, manager.Config{MaxSandboxes: maxSandboxes, Egress: ec}, tweak)
}

// newEnvManager is newEnvAt with the manager configured as mc (its state
// directory, store, agent and log filled in).
func newEnvManager(t testing.TB, dir string, mc manager.Config, tweak func(*mcp.Config)) *env {
	t.Helper()
	e := &env{dir: dir}
	var err error
	if e.st, err = store.Open(e.dir); err != nil {
		t.Fatal(err)
	}
	mc.StateDir, mc.Store, mc.AgentBinary, mc.AllowDegraded, mc.Logf = e.dir, e.st, airlockBin(t), true, t.Logf
	e.m, err = manager.Open(mc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mcp.Config{Manager: e.m, Version: "test", Logf: t.Logf}
	if tweak != nil {
		tweak(&cfg)
	}
	if e.svc, err = mcp.New(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.svc.Close()
		e.m.Close()
		e.st.Close()
	})
	return e
}

// connect opens an in-memory MCP session to the service.
func (e *env) connect(t testing.TB) *sdk.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := sdk.NewInMemoryTransports()
	if _, err := e.svc.Server().Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// call calls a tool; a protocol error fails the test.
func call(t testing.TB, cs *sdk.ClientSession, name string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if d := time.Since(start); d > 2*time.Second {
		t.Logf("%s %v took %s", name, args, d.Round(time.Millisecond))
	}
	if err != nil {
		t.Fatalf("%s %v: protocol error: %v", name, args, err)
	}
	return res
}

// text joins a result's text content.
func text(r *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
			b.WriteString("\n")
		}
	}
	return b.String()
}

// mustOK calls a tool and fails unless the result is a success.
func mustOK(t testing.TB, cs *sdk.ClientSession, name string, args map[string]any) string {
	t.Helper()
	r := call(t, cs, name, args)
	if r.IsError {
		t.Fatalf("%s %v: tool error: %s", name, args, text(r))
	}
	return text(r)
}

// mustFail calls a tool and fails unless the result is a tool error.
func mustFail(t testing.TB, cs *sdk.ClientSession, name string, args map[string]any) string {
	t.Helper()
	r := call(t, cs, name, args)
	if !r.IsError {
		t.Fatalf("%s %v: want a tool error, got success: %s", name, args, text(r))
	}
	return text(r)
}

// ownSandbox returns the id of the session's own sandbox from
// list_sandboxes.
func ownSandbox(t testing.TB, cs *sdk.ClientSession) string {
	t.Helper()
	out := mustOK(t, cs, "list_sandboxes", nil)
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "(this session's own sandbox)") {
			return strings.Fields(line)[0]
		}
	}
	t.Fatalf("no own sandbox in %q", out)
	return ""
}

// alive reports whether pid is a live, non-zombie process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// waitGone waits until sandbox id is recorded as ended in st and its init
// process and cgroups are gone from the host; it returns the record.
func waitGone(t testing.TB, st *store.Store, id string) *store.Sandbox {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, err := st.GetSandbox(context.Background(), id)
		if err != nil {
			t.Fatalf("sandbox %s: %v", id, err)
		}
		if rec.State != store.StateRunning && (rec.InitPID <= 0 || !alive(rec.InitPID)) && len(cgroupDirs(id)) == 0 {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still %s (init pid %d alive: %v, cgroups %v)", id, rec.State, rec.InitPID, alive(rec.InitPID), cgroupDirs(id))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cgroupDirs lists the host cgroup directories named after sandbox id.
func cgroupDirs(id string) []string {
	var found []string
	for _, pat := range []string{"/sys/fs/cgroup/*/airlock/" + id, "/sys/fs/cgroup/airlock/" + id, "/sys/fs/cgroup/*/airlock/*/" + id} {
		m, _ := filepath.Glob(pat)
		found = append(found, m...)
	}
	return found
}
