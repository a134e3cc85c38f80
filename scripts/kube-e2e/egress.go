// kube-e2e drive egress: a sandbox's allowlist and injected header through
// the cluster egress proxy (`airlock egress-proxy`) on the real node.

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// Addresses of the host's loopback that the sandbox reaches only through the
// proxy: its pod has its own loopback, and the server's NO_PROXY lists
// 127.0.0.1 alone, so a request for these goes to HTTP_PROXY. The upstream
// listens on upstreamIP, named in the allowlist; deniedIP is not.
const (
	upstreamIP = "127.0.0.2"
	deniedIP   = "127.0.0.3"
	e2eHeader  = "X-E2e-Token"
)

// upstream is an HTTP server on the host that records what reached it.
type upstream struct {
	mu   sync.Mutex
	reqs []http.Header
	from []string
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.reqs = append(u.reqs, r.Header.Clone())
	u.from = append(u.from, r.RemoteAddr)
	u.mu.Unlock()
	fmt.Fprintf(w, "upstream-ok %s\n", r.URL.Path)
}

func (u *upstream) seen() ([]http.Header, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.reqs...), append([]string(nil), u.from...)
}

// driveEgress creates a sandbox whose network is an allowlist naming the
// upstream only, with a header to inject for it, and checks from inside the
// pod: a request to the upstream succeeds and the upstream receives the
// header; the value never reaches the sandbox (not in its environment, not
// in the response it reads); a request to another address is refused by the
// proxy (403 "airlock: ...") and reaches nothing. The sandbox is killed at
// the end.
func driveEgress(ctx context.Context, c *client.Client) error {
	ln, err := net.Listen("tcp", upstreamIP+":0")
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	up := &upstream{}
	srv := &http.Server{Handler: up, ReadHeaderTimeout: 30 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	b := make([]byte, 16)
	rand.Read(b)
	value := "e2e-" + hex.EncodeToString(b)

	t0 := time.Now()
	sb, err := c.Create(ctx, client.CreateRequest{
		Metadata: map[string]string{"test": "kubernetes-e2e-egress"}, Timeout: 600,
		Network: &client.Network{Mode: "allowlist", Allow: []string{upstreamIP}},
		Secrets: []client.Secret{{Host: upstreamIP, Header: e2eHeader, Value: value}},
	})
	if err != nil {
		return fmt.Errorf("create with an allowlist and a secret: %w", err)
	}
	step("egress: sandbox %s created in %v (allow %s, header %s injected for it)", sb.ID, time.Since(t0).Round(time.Millisecond), upstreamIP, e2eHeader)
	defer c.Kill(context.WithoutCancel(ctx), sb.ID)

	// urllib follows HTTP_PROXY, which the server set to the egress proxy.
	const script = `import os, sys, urllib.request, urllib.error
def get(u):
    try:
        r = urllib.request.urlopen(u, timeout=60)
        return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except Exception as e:
        return 0, repr(e)
print("PROXY", os.environ.get("HTTP_PROXY", ""))
for u in sys.argv[1:]:
    s, b = get(u)
    print("GOT", s, b.strip().replace("\n", " ")[:300])
print("ENV", " ".join(sorted(os.environ)))
`
	allowed := fmt.Sprintf("http://%s:%d/allowed", upstreamIP, port)
	denied := fmt.Sprintf("http://%s:%d/denied", deniedIP, port)
	// The pod's proxy may take a moment to learn the pod (it watches pods
	// and Secrets): retry while the allowed request is refused.
	var out string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", script, allowed, denied}, TimeLimit: 3 * time.Minute})
		if err != nil {
			return fmt.Errorf("egress exec: %w", err)
		}
		out = res.Stdout + res.Stderr
		if res.ExitCode != 0 {
			return fmt.Errorf("egress exec: exit %d: %s", res.ExitCode, out)
		}
		if strings.Contains(out, "GOT 200 upstream-ok /allowed") || time.Now().After(deadline) {
			break
		}
		step("egress: allowed request not through yet: %s", strings.TrimSpace(out))
		time.Sleep(2 * time.Second)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "PROXY http://") {
		return fmt.Errorf("egress: output %q", out)
	}
	if lines[1] != "GOT 200 upstream-ok /allowed" {
		return fmt.Errorf("egress: the allowlisted upstream through %s: %s", lines[0], lines[1])
	}
	if !strings.HasPrefix(lines[2], "GOT 403 ") || !strings.Contains(lines[2], "airlock:") {
		return fmt.Errorf("egress: a destination off the allowlist answered %q, want the proxy's 403 \"airlock: ...\"", lines[2])
	}
	if strings.Contains(out, value) {
		return fmt.Errorf("egress: the injected value reached the sandbox: %s", out)
	}
	reqs, from := up.seen()
	got := 0
	for i, h := range reqs {
		if h.Get(e2eHeader) != value {
			return fmt.Errorf("egress: request %d at the upstream (from %s) lacks the injected %s", i, from[i], e2eHeader)
		}
		if host, _, _ := net.SplitHostPort(from[i]); !net.ParseIP(host).IsLoopback() {
			return fmt.Errorf("egress: request %d reached the upstream from %s, not through the proxy on the host", i, from[i])
		}
		got++
	}
	if got == 0 {
		return fmt.Errorf("egress: nothing reached the upstream")
	}
	step("egress: %s; allowed: %q; denied: %q; the upstream got %d request(s) with %s injected (from %s), the sandbox never saw the value",
		lines[0], lines[1], lines[2], got, e2eHeader, from[0])
	if err := c.Kill(ctx, sb.ID); err != nil {
		return fmt.Errorf("egress: kill %s: %w", sb.ID, err)
	}
	fmt.Println(sb.ID)
	return nil
}
