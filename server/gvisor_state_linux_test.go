package server_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestE2EGVisorRunningSurvivesCrash: five running gvisor sandboxes with an
// allowlist, each with a workspace file, a Python variable and a background
// process, survive a SIGKILL of the server: the restarted server takes each
// over as it runs (its agent dialled in the sandbox's own network
// namespace, token-checked), and each answers with its state intact and
// the same egress policy (allowed name reached, other refused, both in its
// own network log). A program inside that connects to the agent's
// reconnect address without the token gets nothing and does not take the
// agent from the server. A sandbox killed afterwards leaves nothing.
func TestE2EGVisorRunningSurvivesCrash(t *testing.T) {
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	e := startNetEnv(t, "--default-runtime", "gvisor")
	ctx := ctxT(t)
	const n = 5
	var ids []string
	for i := 0; i < n; i++ {
		sb := e.create(t, &client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}})
		if sb.Runtime != "gvisor" {
			t.Fatalf("runtime %q", sb.Runtime)
		}
		ids = append(ids, sb.ID)
		if _, err := e.c.WriteFile(ctx, sb.ID, "kept.txt", strings.NewReader(fmt.Sprintf("kept-%d\n", i)), 0); err != nil {
			t.Fatal(err)
		}
		if res := runCell(t, e.c, sb.ID, client.CodeRequest{Code: fmt.Sprintf("x = %d", 10*i)}); res.Error != nil {
			t.Fatalf("cell: %+v", res.Error)
		}
		if _, err := e.c.Start(ctx, sb.ID, client.ExecRequest{Shell: "sleep 600", Tag: "bg"}); err != nil {
			t.Fatal(err)
		}
		want(t, "before the crash", e.sh(t, sb.ID, "curl -sS "+e.url("http", "web.test", "/before")), "http-ok host=web.test:")
	}
	e.srv.crash() // SIGKILL
	e.srv = startServer(t, e.state, append(e.serveArgs(), "--default-runtime", "gvisor")...)
	e.c = client.New(e.srv.URL, e.key)
	for i, id := range ids {
		got, err := e.c.Get(ctx, id)
		if err != nil || got.State != "running" || !got.Reattached || got.Paused {
			t.Fatalf("sandbox %d after the restart: %+v %v", i, got, err)
		}
		if res, err := e.c.Exec(ctx, id, client.ExecRequest{Argv: []string{"cat", "kept.txt"}}); err != nil || res.Stdout != fmt.Sprintf("kept-%d\n", i) {
			t.Fatalf("sandbox %d: file after the restart: %+v %v", i, res, err)
		}
		if res := runCell(t, e.c, id, client.CodeRequest{Code: "x + 1"}); res.Error != nil || res.Text != fmt.Sprint(10*i+1) {
			t.Fatalf("sandbox %d: Python variable after the restart: %+v", i, res)
		}
		if res := e.sh(t, id, "pgrep -x sleep >/dev/null && echo alive"); res.Stdout != "alive\n" {
			t.Fatalf("sandbox %d: background process after the restart: %+v", i, res)
		}
		res := e.sh(t, id, fmt.Sprintf(`curl -sS %s
curl -sS -w 'code=%%{http_code}\n' %s`, e.url("http", "web.test", "/after"), e.url("http", "other.test", "/")))
		want(t, "egress after the restart", res, "http-ok host=web.test:",
			"airlock: other.test is not in network.allow", "code=403")
		e.waitLog(t, id, "the refusal in the sandbox's own log", func(l []client.Connection) bool {
			return hasConn(l, "other.test", 0, false, "not in network.allow") && hasConn(l, "web.test", 0, true, "")
		})
	}

	// Hostile: a program connects to the agent's reconnect address with a
	// wrong token, then with none; both are closed without a byte (the
	// second after the agent's token deadline), and the server keeps the
	// agent.
	prog := `import socket
for pre in (b"0" * 64 + b"\n", b""):
    s = socket.create_connection(("127.0.0.1", 7070), timeout=20)
    s.sendall(pre)
    s.settimeout(60)
    try:
        d = s.recv(100)
        print("got", len(d))
    except socket.timeout:
        print("timeout")
    s.close()
`
	res, err := e.c.Exec(ctx, ids[0], client.ExecRequest{Argv: []string{"python3", "-c", prog}, Timeout: 150})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "got 0\ngot 0\n" {
		t.Fatalf("a program at the agent's address: %q (stderr %q), want both connections closed without a byte", res.Stdout, res.Stderr)
	}
	if res := e.sh(t, ids[0], "cat kept.txt"); res.Stdout != "kept-0\n" {
		t.Fatalf("the server lost the agent to a program inside: %+v", res)
	}

	if err := e.c.Kill(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "no process of the killed sandbox left", func() bool { return !hostHasArg(ids[0]) })
	for _, p := range []string{filepath.Join(gvisor.StateBase, "bundles", ids[0]), filepath.Join(gvisor.StateBase, "root", "*"+ids[0]+"*"),
		filepath.Join(gvisor.StateBase, "netns", ids[0]), filepath.Join(e.state, "sandboxes", ids[0])} {
		if m, _ := filepath.Glob(p); len(m) > 0 {
			t.Errorf("left behind: %v", m)
		}
	}
}

// TestE2EGVisorForksWithNetwork: three forks of a gvisor sandbox with an
// allowlist each run in a network namespace of their own with the egress
// proxy's listeners: each reaches the allowed local server and is refused
// another name, with entries in its own network log (not the original's);
// a connection open at the snapshot comes back broken, a listener of the
// original's program works in each fork; the original keeps working.
func TestE2EGVisorForksWithNetwork(t *testing.T) {
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	e := startNetEnv(t, "--default-runtime", "gvisor")
	ctx := ctxT(t)
	sb := e.create(t, &client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}})
	if _, err := e.c.Start(ctx, sb.ID, client.ExecRequest{Shell: "cd /tmp && echo listener-ok > index.html && exec python3 -m http.server 8000 --bind 127.0.0.1", Tag: "srv"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the program's listener", func() bool {
		return strings.Contains(e.sh(t, sb.ID, "curl -sS --noproxy '*' http://127.0.0.1:8000/ 2>&1").Stdout, "listener-ok")
	})
	if res := runCell(t, e.c, sb.ID, client.CodeRequest{Code: "import socket\nopen_conn = socket.create_connection(('127.0.0.1', 3128))"}); res.Error != nil {
		t.Fatalf("cell: %+v", res.Error)
	}
	snap, err := e.c.MemorySnapshot(ctx, sb.ID)
	if err != nil {
		t.Fatalf("snapshot of a gvisor sandbox with network: %v", err)
	}
	before, err := e.c.NetworkLog(ctx, sb.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var forks []string
	for i := 0; i < 3; i++ {
		f, err := e.c.Create(ctx, client.CreateRequest{Snapshot: snap.ID, Timeout: 600})
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
		forks = append(forks, f.ID)
		t.Cleanup(func() { e.c.Kill(ctx, f.ID) })
		nw, err := e.c.Network(ctx, f.ID)
		if err != nil || nw.Mode != "allowlist" || !nw.Listening {
			t.Fatalf("fork %d network: %+v %v", i, nw, err)
		}
		res := e.sh(t, f.ID, fmt.Sprintf(`curl -sS %s
curl -sS -w 'code=%%{http_code}\n' %s
curl -sS --noproxy '*' http://127.0.0.1:8000/`, e.url("http", "web.test", fmt.Sprintf("/fork%d", i)), e.url("http", "other.test", "/")))
		want(t, fmt.Sprintf("fork %d", i), res, "http-ok host=web.test:",
			"airlock: other.test is not in network.allow", "code=403", "listener-ok")
		cell := runCell(t, e.c, f.ID, client.CodeRequest{Code: `try:
    open_conn.sendall(b"GET http://web.test/ HTTP/1.0\r\n\r\n")
    r = "eof" if open_conn.recv(100) == b"" else "answered"
except OSError as ex:
    r = "error"
r`})
		if cell.Error != nil || (cell.Text != "'eof'" && cell.Text != "'error'") {
			t.Fatalf("fork %d: the connection open at the snapshot: %+v, want it broken", i, cell)
		}
		e.waitLog(t, f.ID, fmt.Sprintf("fork %d's own network log", i), func(l []client.Connection) bool {
			return hasConn(l, "other.test", 0, false, "not in network.allow") && hasConn(l, "web.test", 0, true, "")
		})
	}
	after, err := e.c.NetworkLog(ctx, sb.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("the original's network log grew from %d to %d entries with its forks' connections", len(before), len(after))
	}
	want(t, "the original after its forks", e.sh(t, sb.ID, "curl -sS "+e.url("http", "web.test", "/orig")+"; curl -sS --noproxy '*' http://127.0.0.1:8000/"),
		"http-ok host=web.test:", "listener-ok")
	e.waitLog(t, sb.ID, "the original's own entry", func(l []client.Connection) bool { return len(l) == len(before)+1 })

	// The forks outlive a SIGKILL of the server like any running sandbox
	// (their agents have the original's token, stored with the snapshot).
	e.srv.crash()
	e.srv = startServer(t, e.state, append(e.serveArgs(), "--default-runtime", "gvisor")...)
	e.c = client.New(e.srv.URL, e.key)
	for i, id := range append(forks, sb.ID) {
		got, err := e.c.Get(ctx, id)
		if err != nil || got.State != "running" || !got.Reattached {
			t.Fatalf("sandbox %d after the restart: %+v %v", i, got, err)
		}
		want(t, "after the restart", e.sh(t, id, "curl -sS "+e.url("http", "web.test", "/restarted")+"; curl -sS --noproxy '*' http://127.0.0.1:8000/"),
			"http-ok host=web.test:", "listener-ok")
	}
}

// TestE2EGVisorGraceWithoutServer: a running gvisor sandbox whose server
// dies and does not come back within --agent-grace ends on its own: its
// agent kills everything and runsc, the sentry and the gofer exit. The
// server started later records it lost and leaves nothing of it (bundle,
// pinned namespace, runsc state, cgroups).
func TestE2EGVisorGraceWithoutServer(t *testing.T) {
	state, key, s1, sb := gvisorSandbox(t, "--agent-grace", "3s")
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	if _, err := c.Start(ctx, sb.ID, client.ExecRequest{Shell: "sleep 600", Tag: "bg"}); err != nil {
		t.Fatal(err)
	}
	pid := initPid(t, state, sb.ID)
	s1.crash()
	eventually(t, 90*time.Second, "the sandbox ends once the grace is over", func() bool {
		return !alive(pid) && len(pidsInCgroup(t, sb.ID)) == 0
	})
	s2 := startServer(t, state)
	c = client.New(s2.URL, key)
	if got, err := c.Get(ctx, sb.ID); err != nil || got.State != "lost" {
		t.Fatalf("after the restart: %+v %v", got, err)
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
