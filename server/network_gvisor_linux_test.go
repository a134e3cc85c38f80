package server_test

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"testing"

	"airlock/client"
	"airlock/runtime/gvisor"
)

// TestNetworkGVisor: a gvisor sandbox with an allowlist reaches an allowed
// local server through the egress proxy and gets the proxy's refusal for
// another name; the refused name's server sees nothing; the sentry runs
// in a network namespace of its own, not the host's; a gvisor sandbox
// created with network none cannot be given one later (its namespace is
// runsc's netstack: listeners "in" it would open in the host's).
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

	// Its sockets are host sockets: no pause or memory snapshot (422),
	// and it keeps running.
	if _, err := e.c.Pause(ctxT(t), sb.ID); client.StatusOf(err) != http.StatusUnprocessableEntity {
		t.Errorf("pause of a gvisor sandbox with network: %v, want 422", err)
	}
	if _, err := e.c.MemorySnapshot(ctxT(t), sb.ID); client.StatusOf(err) != http.StatusUnprocessableEntity {
		t.Errorf("snapshot of a gvisor sandbox with network: %v, want 422", err)
	}
	res = e.sh(t, sb.ID, "curl -sS "+e.url("http", "web.test", "/again"))
	want(t, "gvisor egress after a refused pause", res, "http-ok host=web.test:")

	none := e.create(t, &client.Network{Mode: "none"})
	_, err = e.c.SetNetwork(ctxT(t), none.ID, client.Network{Mode: "allowlist", Allow: []string{"web.test"}})
	if client.StatusOf(err) != http.StatusUnprocessableEntity {
		t.Fatalf("giving a gvisor sandbox created with network none a network: %v, want 422", err)
	}
	res = e.sh(t, none.ID, "curl -sS "+e.url("http", "web.test", "/")+" 2>&1")
	want(t, "gvisor none", res, "Failed to connect to 127.0.0.1 port 3128")
}
