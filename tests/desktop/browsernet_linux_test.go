package desktop_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/debimage"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/pki"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// browserSecret is the credential the egress proxy injects for
// secret.test: it must reach the outside server and never the sandbox.
const browserSecret = "Bearer sk-browser-9f3c1e7a5d2b"

// outside is the "internet" of TestBrowserSandbox: a plain HTTP server
// and an HTTPS server (certificate for secret.test from a test CA that
// the server's egress proxy trusts with --upstream-ca) on 127.0.0.1,
// which record what reached them.
type outside struct {
	httpPort, httpsPort int
	caFile              string

	mu    sync.Mutex
	hosts []string // Host of every plain HTTP request
	auths []string // Authorization of every HTTPS request, with its SNI
}

func (o *outside) seen() (hosts, auths []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.hosts...), append([]string(nil), o.auths...)
}

func startOutside(t *testing.T, dir string) *outside {
	t.Helper()
	ca, err := pki.NewAuthority("airlock browser test CA", 24*time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("secret.test", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	o := &outside{caFile: dir + "/outside-ca.pem"}
	if err := os.WriteFile(o.caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	hl := listen()
	o.httpPort = hl.Addr().(*net.TCPAddr).Port
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.hosts = append(o.hosts, r.Host)
		o.mu.Unlock()
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!doctype html><title>outside</title><p id=r>web-ok host=%s</p>", r.Host)
	})}
	go hs.Serve(hl)
	t.Cleanup(func() { hs.Close() })

	tl := listen()
	o.httpsPort = tl.Addr().(*net.TCPAddr).Port
	ts := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		o.mu.Lock()
		o.auths = append(o.auths, r.TLS.ServerName+" "+auth)
		o.mu.Unlock()
		w.Header().Set("Content-Type", "text/html")
		if auth != browserSecret {
			w.WriteHeader(401)
			fmt.Fprint(w, "<!doctype html><title>outside</title><p id=r>auth-missing</p>")
			return
		}
		// Never echo the header back: the answer only says it was right.
		fmt.Fprintf(w, "<!doctype html><title>outside</title><p id=r>auth-ok sni=%s</p>", r.TLS.ServerName)
	}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.DER}, PrivateKey: leaf.Key}}}}
	go ts.ServeTLS(tl, "", "")
	t.Cleanup(func() { ts.Close() })
	return o
}

// TestBrowserSandbox runs the browser image's network and memory
// scenarios, under native and gVisor, on one server (importing the image
// takes a minute): network-RUNTIME (testBrowserNetwork) and
// tab-oom-RUNTIME (testBrowserTabOOM).
//
// network: headless Chromium in a sandbox of the browser image,
// with an allowlist and a credential for secret.test, driven by
// playwright-core on the host over CDP through the ports relay:
//
//   - a page from an allowed host (web.test) loads through the sandbox's
//     egress proxy;
//   - a page from a host not on the allowlist (other.test) fails to load,
//     over HTTPS (the proxy refuses the CONNECT: Chromium's
//     ERR_TUNNEL_CONNECTION_FAILED) and over HTTP (the proxy's 403 with the
//     reason), nothing reaches the outside server, and the network log
//     has both attempts refused with the reason;
//   - credential injection works for the browser: the outside HTTPS server
//     for secret.test receives the injected Authorization header (the
//     proxy's certificate for secret.test, from the sandbox's CA, is
//     trusted by Chromium through the NSS database airlock-browser fills),
//     while the value is nowhere inside: not in the page, Chromium's
//     profile, the home directory, or any process's environment or
//     command line.
func TestBrowserSandbox(t *testing.T) {
	testserver.NeedRoot(t)
	state := testserver.StateDir(t)
	it.StoreDebImage(t, state, debimage.Browser())
	o := startOutside(t, state)
	args := []string{"--upstream-ca", o.caFile}
	for _, n := range []string{"web.test", "other.test", "secret.test"} {
		args = append(args, "--resolve", n+"=127.0.0.1")
	}
	s := testserver.Start(t, state, args...)
	key := testserver.NewKey(t, state, "browser")
	for _, runtime := range []string{"native", "gvisor"} {
		t.Run("network-"+runtime, func(t *testing.T) {
			if _, err := os.Stat("/usr/local/bin/runsc"); err != nil && runtime == "gvisor" {
				t.Skipf("no runsc (scripts/setup.sh installs it): %v", err)
			}
			testBrowserNetwork(t, s, key, runtime, o)
		})
	}
	for _, runtime := range []string{"native", "gvisor"} {
		t.Run("tab-oom-"+runtime, func(t *testing.T) {
			if _, err := os.Stat("/usr/local/bin/runsc"); err != nil && runtime == "gvisor" {
				t.Skipf("no runsc (scripts/setup.sh installs it): %v", err)
			}
			testBrowserTabOOM(t, s, key, runtime)
		})
	}
	if log := s.ReadLog(); strings.Contains(log, browserSecret) || strings.Contains(log, strings.TrimPrefix(browserSecret, "Bearer ")) {
		t.Error("the server's log holds the secret")
	}
}

func testBrowserNetwork(t *testing.T, s *testserver.Server, key, runtime string, o *outside) {
	c := client.New(s.URL, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, client.CreateRequest{Image: "browser", Timeout: 900, Runtime: runtime,
		Limits:  &client.Limits{MemoryBytes: 2 << 30, Pids: 1024, CPUs: 2, DiskBytes: 1 << 30},
		Network: &client.Network{Mode: "allowlist", Allow: []string{"web.test", "secret.test", "127.0.0.1"}},
		Secrets: []client.Secret{{Host: "secret.test", Header: "Authorization", Value: browserSecret}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), sb.ID)
	hostsBefore, authsBefore := o.seen()
	ws := startBrowser(t, ctx, s, c, key, sb.ID)
	web := "http://web.test:" + strconv.Itoa(o.httpPort) + "/"
	sum := node(t, ctx, []string{"AIRLOCK_KEY=" + key, "CDP_URL=" + ws,
		"WEB_URL=" + web,
		"OTHER_HTTP=http://other.test:" + strconv.Itoa(o.httpPort) + "/",
		"OTHER_HTTPS=https://other.test:" + strconv.Itoa(o.httpsPort) + "/",
		"SECRET_URL=https://secret.test:" + strconv.Itoa(o.httpsPort) + "/secret",
	}, "browser-net.mjs")
	t.Logf("playwright-core over CDP: %v", sum)
	if strings.Contains(fmt.Sprint(sum), strings.TrimPrefix(browserSecret, "Bearer ")) {
		t.Error("the page shows the secret")
	}

	hosts, auths := o.seen()
	hosts, auths = hosts[len(hostsBefore):], auths[len(authsBefore):]
	for _, h := range hosts {
		if strings.HasPrefix(h, "other.test") {
			t.Errorf("a request for other.test reached the outside: %q", hosts)
		}
	}
	if !slices.Contains(hosts, "web.test:"+strconv.Itoa(o.httpPort)) {
		t.Errorf("the outside HTTP server saw %q, want web.test", hosts)
	}
	if len(auths) == 0 {
		t.Fatal("no request reached the outside HTTPS server for secret.test")
	}
	for _, a := range auths {
		if a != "secret.test "+browserSecret {
			t.Errorf("the outside HTTPS server saw %q, want SNI secret.test with the injected header", a)
		}
	}

	// The network log has the refusals, with their reason, and the
	// injected connection.
	waitFor(t, "the browser's connections in the network log", time.Minute, func() bool {
		log, err := c.NetworkLog(ctx, sb.ID, 0)
		if err != nil {
			return false
		}
		var refusedHTTP, refusedTLS, secret bool
		for _, e := range log {
			switch {
			case e.Host == "other.test" && !e.Allowed && strings.Contains(e.Reason, "not in network.allow"):
				refusedHTTP = refusedHTTP || e.Port == o.httpPort
				refusedTLS = refusedTLS || e.Port == o.httpsPort
			case e.Host == "secret.test" && e.Allowed && e.Port == o.httpsPort:
				secret = true
			}
		}
		return refusedHTTP && refusedTLS && secret
	})

	// The value is nowhere inside. Everything is collected and searched
	// on the host, so that no search pattern enters the sandbox either.
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c",
		`for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null; echo; done
tar -cf /tmp/inside.tar /tmp/chromium-profile /home/user 2>/dev/null; test -s /tmp/inside.tar`}, Timeout: 120})
	if err != nil || res.ExitCode != 0 || !strings.Contains(res.Stdout, "remote-debugging-port") {
		t.Fatalf("collecting /proc and the profile: %+v %v", res, err)
	}
	noSecret(t, "environments and command lines", res.Stdout)
	b, err := c.ReadFile(ctx, sb.ID, "/tmp/inside.tar")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("tar of the profile: %v", err)
		}
		body, _ := io.ReadAll(tr)
		noSecret(t, h.Name, string(body))
		n++
	}
	if n < 10 {
		t.Fatalf("tar of Chromium's profile and home: %d entries", n)
	}
}

func noSecret(t *testing.T, where, s string) {
	t.Helper()
	if strings.Contains(s, browserSecret) || strings.Contains(s, strings.TrimPrefix(browserSecret, "Bearer ")) {
		t.Errorf("%s holds the secret", where)
	}
}
