package server_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestNetworkGVisor: a gvisor sandbox with an allowlist reaches an allowed
// local server through the egress proxy and gets the proxy's refusal for
// another name; the refused name's server sees nothing; the sentry runs
// in a network namespace of its own, not the host's, also after a pause
// and resume (checkpoint and restore), and after a server restart while
// paused (a new egress namespace); it can be snapshotted; a gvisor
// sandbox created with network none can be given one later (PUT
// /network), whose listeners open in its own namespace, not the host's.
func TestNetworkGVisor(t *testing.T) {
	needRoot(t)
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	e := startNetEnv(t, "--default-runtime", "gvisor")
	sb := e.create(t, &client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}})
	if sb.Runtime != "gvisor" {
		t.Fatalf("runtime %q, want gvisor", sb.Runtime)
	}
	res := e.sh(t, sb.ID, fmt.Sprintf(`curl -sS %s
curl -sS -w 'code=%%{http_code}\n' %s`, e.url("http", "web.test", "/"), e.url("http", "other.test", "/")))
	want(t, "gvisor egress", res, "http-ok host=web.test:",
		"airlock: other.test is not in network.allow; add other.test to network.allow to permit it", "code=403")
	if n := e.httpHits.Load(); n != 1 {
		t.Errorf("the HTTP server got %d requests, want 1 (the allowed one)", n)
	}

	// Host side: none of the sandbox's processes (sentry, gofer) is in
	// the host's network namespace.
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	pids := pidsInCgroup(t, sb.ID)
	if len(pids) == 0 {
		t.Fatal("no processes in the sandbox's cgroup")
	}
	for _, pid := range pids {
		ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
		cmd, _ := readCmdline(pid)
		if err == nil && ns == host {
			t.Errorf("sandbox process %d (%s) is in the host's network namespace %s", pid, cmd, ns)
		}
	}

	// It can be snapshotted (its forks get namespaces of their own:
	// TestE2EGVisorForksWithNetwork), and it keeps running.
	if _, err := e.c.MemorySnapshot(ctxT(t), sb.ID); err != nil {
		t.Errorf("snapshot of a gvisor sandbox with network: %v", err)
	}
	res = e.sh(t, sb.ID, "curl -sS "+e.url("http", "web.test", "/again"))
	want(t, "gvisor egress after a snapshot", res, "http-ok host=web.test:")
	// Pause checkpoints it to disk (nothing of it runs) and resume
	// restores it into the same namespace: the proxy, its policy and its
	// refusals are there again.
	if _, err := e.c.Pause(ctxT(t), sb.ID); err != nil {
		t.Fatalf("pause of a gvisor sandbox with network: %v", err)
	}
	if pids := pidsInCgroup(t, sb.ID); len(pids) != 0 {
		t.Fatalf("paused (on disk), the sandbox still runs %v", pids)
	}
	if _, err := e.c.Resume(ctxT(t), sb.ID); err != nil {
		t.Fatalf("resume of a gvisor sandbox with network: %v", err)
	}
	res = e.sh(t, sb.ID, fmt.Sprintf(`curl -sS %s
curl -sS -w 'code=%%{http_code}\n' %s`, e.url("http", "web.test", "/resumed"), e.url("http", "other.test", "/")))
	want(t, "gvisor egress after pause and resume", res, "http-ok host=web.test:",
		"airlock: other.test is not in network.allow; add other.test to network.allow to permit it", "code=403")
	if n := e.httpHits.Load(); n != 3 {
		t.Errorf("the HTTP server got %d requests, want 3 (the allowed ones)", n)
	}
	for _, pid := range pidsInCgroup(t, sb.ID) {
		ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
		if err == nil && ns == host {
			t.Errorf("restored sandbox process %d is in the host's network namespace %s", pid, ns)
		}
	}

	// Paused when the server is killed (SIGKILL), it is taken over paused
	// by the next server, which gives it a new egress namespace with the
	// proxy's listeners: after resume the same policy holds there.
	if _, err := e.c.Pause(ctxT(t), sb.ID); err != nil {
		t.Fatalf("pause before the restart: %v", err)
	}
	e.srv.crash()
	e.srv = startServer(t, e.state, append(e.serveArgs(), "--default-runtime", "gvisor")...)
	e.c = client.New(e.srv.URL, e.key)
	if got, err := e.c.Get(ctxT(t), sb.ID); err != nil || !got.Paused || !got.Reattached || got.State != "running" {
		t.Fatalf("after the restart: %+v %v", got, err)
	}
	if _, err := e.c.Resume(ctxT(t), sb.ID); err != nil {
		t.Fatalf("resume after the restart: %v", err)
	}
	res = e.sh(t, sb.ID, fmt.Sprintf(`curl -sS %s
curl -sS -w 'code=%%{http_code}\n' %s`, e.url("http", "web.test", "/restarted"), e.url("http", "other.test", "/")))
	want(t, "gvisor egress after a restart while paused", res, "http-ok host=web.test:",
		"airlock: other.test is not in network.allow; add other.test to network.allow to permit it", "code=403")
	if n := e.httpHits.Load(); n != 4 {
		t.Errorf("the HTTP server got %d requests, want 4 (the allowed ones)", n)
	}
	for _, pid := range pidsInCgroup(t, sb.ID) {
		ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
		if err == nil && ns == host {
			t.Errorf("sandbox process %d restored after the restart is in the host's network namespace %s", pid, ns)
		}
	}

	// Created with network none, it reaches nothing; PUT /network opens
	// the proxy's listeners in its own namespace (never the host's), and
	// the new policy holds there; back to none, the proxy refuses.
	none := e.create(t, &client.Network{Mode: "none"})
	res = e.sh(t, none.ID, "curl -sS "+e.url("http", "web.test", "/")+" 2>&1")
	want(t, "gvisor none", res, "Failed to connect to 127.0.0.1 port 3128")
	hostLn := hostListeners(t)
	nw, err := e.c.SetNetwork(ctxT(t), none.ID, client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}})
	if err != nil || !nw.Listening {
		t.Fatalf("giving a gvisor sandbox created with network none a network: %+v %v", nw, err)
	}
	if got := hostListeners(t); got != hostLn {
		t.Errorf("PUT /network opened listeners in the host's namespace: %d proxy-port listeners before, %d after", hostLn, got)
	}
	res = e.sh(t, none.ID, fmt.Sprintf(`curl -sS %s
curl -sS -w 'code=%%{http_code}
' %s`, e.url("http", "web.test", "/attached"), e.url("http", "other.test", "/")))
	want(t, "gvisor none given a network", res, "http-ok host=web.test:",
		"airlock: other.test is not in network.allow", "code=403")
	if _, err := e.c.SetNetwork(ctxT(t), none.ID, client.Network{Mode: "none"}); err != nil {
		t.Fatal(err)
	}
	res = e.sh(t, none.ID, "curl -sS -w 'code=%{http_code}\n' "+e.url("http", "web.test", "/")+" 2>&1")
	want(t, "gvisor back to none", res, "code=403")
}

// hostListeners counts TCP listeners on the proxy's ports (3128, 1080) in
// the host's network namespace.
func hostListeners(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && f[3] == "0A" && (strings.HasSuffix(f[1], ":0C38") || strings.HasSuffix(f[1], ":0438")) {
			n++
		}
	}
	return n
}
