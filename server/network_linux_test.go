package server_test

import (
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// TestNetworkAllowlist: in a sandbox created through the API with an
// allowlist, allowed names are reachable over HTTP (absolute URI), HTTPS
// (CONNECT) and SOCKS5 with curl, Python urllib and requests; a name not in
// the list is refused with the reason visible to the program; deny beats
// allow; the network log has every attempt with its verdict and reason.
func TestNetworkAllowlist(t *testing.T) {
	e := startNetEnv(t)
	sb := e.create(t, &client.Network{Mode: "allowlist",
		Allow: []string{"web.test", "tls.test", "*.corp.test", "127.0.0.1"},
		Deny:  []string{"blocked.corp.test"}})

	// The proxy environment is set.
	res := e.sh(t, sb.ID, "env | sort")
	want(t, "env", res, "HTTP_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128",
		"ALL_PROXY=socks5h://127.0.0.1:1080", "NO_PROXY=localhost,127.0.0.1,::1")

	// curl: HTTP through HTTP_PROXY, HTTPS through CONNECT, both through
	// SOCKS5 with names resolved by the proxy.
	res = e.sh(t, sb.ID, fmt.Sprintf(`set -e
curl -sS %s
curl -sS --cacert /workspace/ca.pem %s
curl -sS --socks5-hostname 127.0.0.1:1080 %s
curl -sS --cacert /workspace/ca.pem -x socks5h://127.0.0.1:1080 %s`,
		e.url("http", "web.test", "/"), e.url("https", "tls.test", "/"),
		e.url("http", "api.corp.test", "/"), e.url("https", "tls.test", "/socks")))
	if res.ExitCode != 0 {
		t.Fatalf("curl: %+v", res)
	}
	want(t, "curl", res, "http-ok host=web.test:", "https-ok sni=tls.test", "http-ok host=api.corp.test:")
	if n := strings.Count(res.Stdout, "https-ok sni=tls.test"); n != 2 {
		t.Errorf("curl over CONNECT and SOCKS5: %d HTTPS answers, want 2:\n%s", n, res.Stdout)
	}

	// Python urllib (proxies from the environment) and requests.
	res = e.py(t, sb.ID, fmt.Sprintf(`
import ssl, urllib.request
print(urllib.request.urlopen(%q, timeout=20).read().decode().strip())
ctx = ssl.create_default_context(cafile="/workspace/ca.pem")
print(urllib.request.urlopen(%q, context=ctx, timeout=20).read().decode().strip())
import requests
print(requests.get(%q, timeout=20).text.strip())
print(requests.get(%q, verify="/workspace/ca.pem", timeout=20).text.strip())
`, e.url("http", "web.test", "/urllib"), e.url("https", "tls.test", "/urllib"),
		e.url("http", "api.corp.test", "/requests"), e.url("https", "tls.test", "/requests")))
	if res.ExitCode != 0 {
		t.Fatalf("python: %+v", res)
	}
	want(t, "python", res, "http-ok host=web.test:", "http-ok host=api.corp.test:")
	if n := strings.Count(res.Stdout, "https-ok sni=tls.test"); n != 2 {
		t.Errorf("python HTTPS: %d answers, want 2:\n%s", n, res.Stdout)
	}

	// Plain TCP through SOCKS5 to the echo server.
	res = e.py(t, sb.ID, socksScriptCall("echo.corp.test", e.echoPort, "ping"))
	want(t, "socks5 echo", res, "echo: ping")

	// Refused: a name not in the list, over HTTP (403 body), HTTPS
	// (CONNECT 403 with the reason header) and SOCKS5 (reply 2).
	res = e.sh(t, sb.ID, fmt.Sprintf(`curl -sS -w 'code=%%{http_code}\n' %s
curl -sS -v --cacert /workspace/ca.pem %s 2>&1 | grep -i -e 'x-airlock-deny-reason' -e 'CONNECT tunnel failed'
curl -sS -w 'code=%%{http_code}\n' %s`,
		e.url("http", "other.test", "/"), e.url("https", "other.test", "/"), e.url("http", "blocked.corp.test", "/")))
	want(t, "refusals", res,
		"airlock: other.test is not in network.allow; add other.test to network.allow to permit it",
		"code=403",
		"X-Airlock-Deny-Reason: denied: other.test is not in network.allow",
		"CONNECT tunnel failed, response 403",
		// deny wins over the *.corp.test allow entry
		"airlock: blocked.corp.test:"+strconv.Itoa(e.httpPort)+" matches network.deny entry blocked.corp.test (deny wins over allow)")
	res = e.py(t, sb.ID, socksScriptCall("other.test", e.echoPort, "ping"))
	want(t, "socks5 refusal", res, "socks-reply 2")
	res = e.py(t, sb.ID, fmt.Sprintf(`
import urllib.request, urllib.error
try:
    urllib.request.urlopen(%q, timeout=20)
except urllib.error.HTTPError as err:
    print(err.code, err.read().decode().strip())
import requests
r = requests.get(%q, timeout=20)
print(r.status_code, r.text.strip())
`, e.url("http", "other.test", "/"), e.url("http", "blocked.corp.test", "/")))
	want(t, "python refusals", res, "403 airlock: other.test is not in network.allow",
		"403 airlock: blocked.corp.test:"+strconv.Itoa(e.httpPort)+" matches network.deny entry")

	// The reason reaches programs that only print the proxy's status line
	// for a refused CONNECT (pip, requests, urllib over HTTPS), and a
	// destination that is allowed but refuses the connection gets a 502
	// whose body says so instead of starting with "allowed: ...".
	closed := listenLocal(t)
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	res = e.py(t, sb.ID, fmt.Sprintf(`
import urllib.request, urllib.error, requests
try:
    urllib.request.urlopen(%q, timeout=20)
except urllib.error.URLError as err:
    print("urllib:", err)
try:
    requests.get(%q, timeout=20)
except requests.exceptions.ProxyError as err:
    print("requests:", err)
try:
    urllib.request.urlopen("http://web.test:%d/", timeout=20)
except urllib.error.HTTPError as err:
    print("closed:", err.code, err.read().decode().strip())
`, e.url("https", "other.test", "/"), e.url("https", "other.test", "/"), closedPort))
	const otherTLS = "other.test"
	want(t, "CONNECT refusal in the program's error", res,
		"urllib: <urlopen error Tunnel connection failed: 403 airlock: "+otherTLS+" is not in network.allow; add "+otherTLS+" to network.allow",
		"requests: ", "Tunnel connection failed: 403 airlock: "+otherTLS+" is not in network.allow",
		"closed: 502 airlock: cannot connect to web.test:"+strconv.Itoa(closedPort)+": ")
	if strings.Contains(res.Stdout, "closed: 502 allowed") {
		t.Errorf("a 502 body reads as success:\n%s", res.Stdout)
	}
	res = e.sh(t, sb.ID, "curl -sS -v --cacert /workspace/ca.pem "+e.url("https", "other.test", "/")+" 2>&1 | grep '< HTTP/'")
	want(t, "curl -v status line", res, "< HTTP/1.1 403 airlock: "+otherTLS+" is not in network.allow")

	// Every attempt is in the log.
	e.waitLog(t, sb.ID, "every attempt in the network log", func(log []client.Connection) bool {
		return hasConn(log, "web.test", e.httpPort, true, "matches network.allow entry web.test") &&
			hasConn(log, "tls.test", e.httpsPort, true, "matches network.allow entry tls.test") &&
			hasConn(log, "api.corp.test", e.httpPort, true, "*.corp.test") &&
			hasConn(log, "echo.corp.test", e.echoPort, true, "") &&
			hasConn(log, "other.test", e.httpPort, false, "is not in network.allow") &&
			hasConn(log, "other.test", e.httpsPort, false, "is not in network.allow") &&
			hasConn(log, "other.test", e.echoPort, false, "is not in network.allow") &&
			hasConn(log, "blocked.corp.test", e.httpPort, false, "deny wins over allow")
	})
	log, err := e.c.NetworkLog(ctxT(t), sb.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range log {
		if c.Allowed && c.BytesDown == 0 && !strings.Contains(c.Reason, "cannot connect") {
			t.Errorf("allowed connection with no bytes received: %+v", c)
		}
		if c.Time.IsZero() || c.Reason == "" {
			t.Errorf("log entry without time or reason: %+v", c)
		}
	}
	if short, err := e.c.NetworkLog(ctxT(t), sb.ID, 2); err != nil || len(short) != 2 || short[0].Time.Before(short[1].Time) {
		t.Errorf("network log limit 2: %+v %v", short, err)
	}
}

// socksScriptCall returns a Python program running socksScript.
func socksScriptCall(host string, port int, msg string) string {
	return fmt.Sprintf("import sys\nsys.argv = ['x', %q, '%d', %q]\n", host, port, msg) + socksScript
}

// TestNetworkNoDirectRoute: in every mode, a program that ignores the
// proxy cannot connect anywhere: raw TCP to the host's echo server, UDP
// (a DNS query) to the host's loopback, name resolution; the namespace has
// no route and no interface but lo. The host servers see nothing.
func TestNetworkNoDirectRoute(t *testing.T) {
	forEachRuntime(t, networkNoDirectRoute)
}

func networkNoDirectRoute(t *testing.T, runtime string) {
	e := startNetEnv(t, "--default-runtime", runtime)
	prog := fmt.Sprintf(`
import socket
try:
    socket.create_connection(("127.0.0.1", %d), timeout=5)
    print("tcp: connected")
except OSError as err:
    print("tcp:", type(err).__name__)
q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03web\x04test\x00\x00\x01\x00\x01"
for port in (%d, 53):
    try:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.settimeout(5)
        u.connect(("127.0.0.1", port))
        u.send(q)
        u.recv(512)
        print("udp", port, ": answered")
    except OSError as err:
        print("udp", port, ":", type(err).__name__)
try:
    print("resolve:", socket.getaddrinfo("web.test", 80))
except OSError as err:
    print("resolve:", type(err).__name__)
import os
routes = open("/proc/net/route").read().splitlines()[1:]
if os.path.exists("/proc/net/ipv6_route"):
    routes += open("/proc/net/ipv6_route").read().splitlines()
print("routes:", [r for r in routes if not r.split()[-1] == "lo"])
print("ifaces:", sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]))
`, e.echoPort, e.udpPort)
	for _, mode := range []string{"none", "allowlist", "open"} {
		t.Run(mode, func(t *testing.T) {
			n := &client.Network{Mode: mode}
			if mode == "allowlist" {
				n.Allow = []string{"web.test", "echo.corp.test", "127.0.0.1"}
			}
			if mode == "open" {
				n.Allow = []string{"127.0.0.1"}
			}
			sb := e.create(t, n)
			if sb.Runtime != runtime {
				t.Fatalf("runtime %q, want %s", sb.Runtime, runtime)
			}
			res := e.py(t, sb.ID, prog)
			want(t, mode, res, "tcp: ConnectionRefusedError", "udp "+strconv.Itoa(e.udpPort)+" : ConnectionRefusedError",
				"udp 53 : ConnectionRefusedError", "resolve: gaierror", "routes: []", "ifaces: ['lo']")
			if strings.Contains(res.Stdout, "connected") || strings.Contains(res.Stdout, "answered") {
				t.Errorf("%s: a direct connection worked:\n%s", mode, res.Stdout)
			}
			// Through the proxy it works, except in mode none where
			// nothing listens.
			res = e.sh(t, sb.ID, "curl -sS "+e.url("http", "web.test", "/")+" 2>&1")
			if mode == "none" {
				want(t, mode, res, "Failed to connect to 127.0.0.1 port 3128")
				nw, err := e.c.Network(ctxT(t), sb.ID)
				if err != nil || nw.Mode != "none" || nw.Listening {
					t.Errorf("network of a none sandbox: %+v %v", nw, err)
				}
			} else {
				want(t, mode, res, "http-ok host=web.test:")
			}
		})
	}
	if n := e.echoConns.Load(); n != 0 {
		t.Errorf("the echo server got %d direct connections", n)
	}
	if n := e.udpPkts.Load(); n != 0 {
		t.Errorf("the UDP sink got %d packets", n)
	}
}

// TestNetworkLoopbackAndPolicyChange: an allowlisted name that resolves to
// 127.0.0.1 is refused until 127.0.0.1 itself is allowed; policy changes
// through PUT .../network apply to the next connection, are persisted and
// audited; a sandbox created with mode none gets the proxy when switched.
func TestNetworkLoopbackAndPolicyChange(t *testing.T) {
	e := startNetEnv(t)
	ctx := ctxT(t)
	sb := e.create(t, &client.Network{Mode: "allowlist", Allow: []string{"web.test"}})
	get := "curl -sS -w ' code=%{http_code}\\n' " + e.url("http", "web.test", "/")

	res := e.sh(t, sb.ID, get)
	want(t, "loopback refused", res, "airlock: web.test resolves to 127.0.0.1, a loopback address; add 127.0.0.1 to network.allow to permit it", "code=403")
	if e.httpHits.Load() != 0 {
		t.Fatal("the HTTP server was reached although its address is loopback")
	}

	// A port-restricted address entry does not open other ports.
	nw, err := e.c.SetNetwork(ctx, sb.ID, client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1:" + strconv.Itoa(e.echoPort)}})
	if err != nil || nw.Mode != "allowlist" || !nw.Listening {
		t.Fatalf("set network: %+v %v", nw, err)
	}
	res = e.sh(t, sb.ID, get)
	want(t, "other port", res, "add 127.0.0.1 to network.allow", "code=403")

	nw, err = e.c.SetNetwork(ctx, sb.ID, client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}})
	if err != nil || len(nw.Allow) != 2 {
		t.Fatalf("set network: %+v %v", nw, err)
	}
	res = e.sh(t, sb.ID, get)
	want(t, "loopback allowed", res, "http-ok host=web.test:", "code=200")

	// Deny added while running.
	if _, err := e.c.SetNetwork(ctx, sb.ID, client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}, Deny: []string{"web.test"}}); err != nil {
		t.Fatal(err)
	}
	res = e.sh(t, sb.ID, get)
	want(t, "deny added", res, "matches network.deny entry web.test", "code=403")

	// Back to none: the listeners stay and refuse with a reason.
	if _, err := e.c.SetNetwork(ctx, sb.ID, client.Network{Mode: "none"}); err != nil {
		t.Fatal(err)
	}
	res = e.sh(t, sb.ID, get)
	want(t, "none", res, `airlock: network mode is "none"`, "code=403")

	// Invalid policies are refused whole, one line per entry; the policy
	// in force does not change.
	_, err = e.c.SetNetwork(ctx, sb.ID, client.Network{Mode: "allowlist", Allow: []string{"10.1.2.3/8", "*"}})
	if client.StatusOf(err) != 422 || !strings.Contains(err.Error(), "did you mean 10.0.0.0/8") || !strings.Contains(err.Error(), `network.allow[1] "*"`) {
		t.Fatalf("invalid policy: %v", err)
	}
	_, err = e.c.SetNetwork(ctx, sb.ID, client.Network{Mode: "sideways"})
	if client.StatusOf(err) != 422 {
		t.Fatalf("unknown mode: %v", err)
	}
	if nw, err := e.c.Network(ctx, sb.ID); err != nil || nw.Mode != "none" {
		t.Fatalf("network after refused changes: %+v %v", nw, err)
	}

	// The same check at create.
	_, err = e.c.Create(ctx, client.CreateRequest{Network: &client.Network{Mode: "allowlist", Allow: []string{"pypi.org", ".example.com"}}})
	if client.StatusOf(err) != 422 || !strings.Contains(err.Error(), `network.allow[1] ".example.com"`) {
		t.Fatalf("invalid policy at create: %v", err)
	}

	// Persisted and audited.
	rec := storedRecord(t, e.srv.State, sb.ID)
	if n := storedNetwork(t, rec); n.Mode != "none" || len(n.Allow) != 0 {
		t.Errorf("stored network: %+v", n)
	}
	changes := 0
	for _, ev := range auditOf(t, e.srv.State, sb.ID) {
		if ev.Action == "network.change" {
			changes++
			if !strings.Contains(string(ev.Detail), `"from"`) || !strings.Contains(string(ev.Detail), `"to"`) {
				t.Errorf("network.change detail: %s", ev.Detail)
			}
		}
	}
	if changes != 4 {
		t.Errorf("%d network.change audit events, want 4", changes)
	}
	e.waitLog(t, sb.ID, "log of the policy changes", func(log []client.Connection) bool {
		return hasConn(log, "web.test", e.httpPort, false, "loopback address") &&
			hasConn(log, "web.test", e.httpPort, true, "127.0.0.1") &&
			hasConn(log, "web.test", e.httpPort, false, "deny wins") &&
			hasConn(log, "web.test", e.httpPort, false, `network mode is "none"`)
	})

	// Created with none (nothing listens), switched to allowlist while a
	// process runs: the listeners are opened, and the proxy variables
	// that were set from the start work.
	sb2 := e.create(t, nil)
	if _, err := e.c.Start(ctx, sb2.ID, client.ExecRequest{Shell: "sleep 600", Tag: "before"}); err != nil {
		t.Fatal(err)
	}
	res = e.sh(t, sb2.ID, get+" 2>&1")
	want(t, "none at create", res, "Failed to connect to 127.0.0.1 port 3128")
	nw, err = e.c.SetNetwork(ctx, sb2.ID, client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}})
	if err != nil || !nw.Listening {
		t.Fatalf("switch from none: %+v %v", nw, err)
	}
	res = e.sh(t, sb2.ID, get)
	want(t, "after switch", res, "http-ok host=web.test:", "code=200")

	// Another key sees none of it.
	other := client.New(e.srv.URL, newKey(t, e.srv.State, "other"))
	if _, err := other.Network(ctx, sb.ID); client.StatusOf(err) != 404 {
		t.Errorf("other key's GET network: %v", err)
	}
	if _, err := other.SetNetwork(ctx, sb.ID, client.Network{Mode: "open"}); client.StatusOf(err) != 404 {
		t.Errorf("other key's PUT network: %v", err)
	}
	if _, err := other.NetworkLog(ctx, sb.ID, 0); client.StatusOf(err) != 404 {
		t.Errorf("other key's network log: %v", err)
	}
}

// TestNetworkSecretInjection: a secret's header reaches the HTTPS server
// (which checks it and the SNI) for curl, urllib and requests, through the
// per-sandbox CA in the sandbox's trust store, while the value is nowhere
// in the sandbox: not in its environment, its files, /proc/*/environ or
// /proc/*/cmdline. Other hosts are tunneled untouched, and the value is not
// in the server's API answers, stored policy, audit log or log output.
func TestNetworkSecretInjection(t *testing.T) {
	e := startNetEnv(t)
	ctx := ctxT(t)
	sb := e.create(t, &client.Network{Mode: "allowlist", Allow: []string{"secret.test", "tls.test", "127.0.0.1"}},
		client.Secret{Host: "secret.test", Header: "Authorization", Value: testSecret})
	secretURL := e.url("https", "secret.test", "/secret")

	res := e.sh(t, sb.ID, "curl -sS -H 'Authorization: placeholder' "+secretURL)
	want(t, "curl", res, "auth-ok sni=secret.test")
	res = e.py(t, sb.ID, fmt.Sprintf(`
import urllib.request, requests
print(urllib.request.urlopen(%q, timeout=20).read().decode().strip())
print(requests.get(%q, headers={"Authorization": "placeholder"}, timeout=20).text.strip())
`, secretURL, secretURL))
	if n := strings.Count(res.Stdout, "auth-ok sni=secret.test"); n != 2 {
		t.Errorf("python: %d authenticated answers, want 2\n%s\n%s", n, res.Stdout, res.Stderr)
	}
	snis, auths := e.seen()
	if len(auths) != 3 {
		t.Fatalf("HTTPS server saw %d requests on /secret, want 3", len(auths))
	}
	for i := range auths {
		if auths[i] != testSecret || snis[i] != "secret.test" {
			t.Errorf("request %d: Authorization %q, SNI %q", i, auths[i], snis[i])
		}
	}

	// A host without a secret is tunneled untouched: the sandbox's CA
	// does not vouch for it, only the real (test) CA does.
	res = e.sh(t, sb.ID, "curl -sS "+e.url("https", "tls.test", "/")+" 2>&1; curl -sS --cacert /workspace/ca.pem "+e.url("https", "tls.test", "/"))
	want(t, "untouched tunnel", res, "SSL certificate problem", "https-ok sni=tls.test")

	// The trust store: the bundle and the CA alone, read-only.
	res = e.sh(t, sb.ID, `echo "SSL_CERT_FILE=$SSL_CERT_FILE REQUESTS_CA_BUNDLE=$REQUESTS_CA_BUNDLE CURL_CA_BUNDLE=$CURL_CA_BUNDLE NODE_EXTRA_CA_CERTS=$NODE_EXTRA_CA_CERTS"
grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt /etc/airlock/egress-ca.pem
echo x >> /etc/airlock/egress-ca.pem 2>/dev/null || echo read-only`)
	want(t, "trust store", res, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt CURL_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt NODE_EXTRA_CA_CERTS=/etc/airlock/egress-ca.pem",
		"/etc/airlock/egress-ca.pem:1", "read-only")

	// The secret is nowhere inside. Everything is collected and searched
	// on the host, so that no search pattern enters the sandbox either.
	if _, err := e.c.Start(ctx, sb.ID, client.ExecRequest{Shell: "sleep 600", Tag: "bystander"}); err != nil {
		t.Fatal(err)
	}
	res = e.sh(t, sb.ID, `env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat "$f"; echo; done`)
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "HTTPS_PROXY=") || !strings.Contains(res.Stdout, "sleep") {
		t.Fatalf("collecting env and /proc: %+v", res)
	}
	assertNoSecret(t, "env and /proc/*/{environ,cmdline}", res.Stdout)
	res = e.sh(t, sb.ID, `tar -cf - /workspace /tmp /etc 2>/dev/null | base64 -w0`)
	tarball, err := base64.StdEncoding.DecodeString(strings.TrimSpace(res.Stdout))
	if err != nil || len(tarball) < 10240 || res.Truncated {
		t.Fatalf("tar of /workspace /tmp /etc: %d bytes, %v, truncated %v", len(tarball), err, res.Truncated)
	}
	assertNoSecret(t, "files under /workspace /tmp /etc", string(tarball))

	// Nor outside, where the API, the store or the logs could show it.
	nw, err := e.c.Network(ctx, sb.ID)
	if err != nil || len(nw.Secrets) != 1 || nw.Secrets[0].Host != "secret.test" || nw.Secrets[0].Header != "Authorization" || nw.SecretsLost {
		t.Fatalf("network info: %+v %v", nw, err)
	}
	rec := storedRecord(t, e.srv.State, sb.ID)
	assertNoSecret(t, "stored policy", string(rec.Policy))
	assertNoSecret(t, "stored runtime state", string(rec.Runtime))
	for _, ev := range auditOf(t, e.srv.State, sb.ID) {
		assertNoSecret(t, "audit event "+ev.Action, string(ev.Detail))
	}
	e.waitLog(t, sb.ID, "injected connections logged", func(log []client.Connection) bool {
		n := 0
		for _, c := range log {
			if c.Host == "secret.test" && c.Allowed {
				n++
			}
		}
		return n >= 3
	})
	log, _ := e.c.NetworkLog(ctx, sb.ID, 0)
	for _, c := range log {
		assertNoSecret(t, "network log", c.Reason)
	}

	// Invalid secrets are refused at create without echoing the value.
	_, err = e.c.Create(ctx, client.CreateRequest{Network: &client.Network{Mode: "allowlist", Allow: []string{"secret.test"}},
		Secrets: []client.Secret{{Host: "secret.test", Header: "Host", Value: testSecret}}})
	if client.StatusOf(err) != 422 || !strings.Contains(err.Error(), "managed by the proxy") {
		t.Fatalf("secret for the Host header: %v", err)
	}
	assertNoSecret(t, "create error", err.Error())
	e.srv.stop(t)
	srvLog, _ := os.ReadFile(filepath.Join(e.srv.State, "server.log"))
	assertNoSecret(t, "server log", string(srvLog))
}

// assertNoSecret fails if s contains the test secret or its token part.
func assertNoSecret(t *testing.T, where, s string) {
	t.Helper()
	for _, v := range []string{testSecret, strings.TrimPrefix(testSecret, "Bearer ")} {
		if strings.Contains(s, v) {
			t.Errorf("%s contains the secret", where)
		}
	}
}

// TestNetworkReattach: after a server crash, the next server reattaches an
// allowlist sandbox with new listeners inside its namespace and the stored
// policy (including a change made before the crash); its secrets are
// reported lost.
func TestNetworkReattach(t *testing.T) {
	e := startNetEnv(t)
	ctx := ctxT(t)
	sb := e.create(t, &client.Network{Mode: "allowlist", Allow: []string{"other.test"}},
		client.Secret{Host: "secret.test", Header: "Authorization", Value: testSecret})
	if _, err := e.c.SetNetwork(ctx, sb.ID, client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	get := "curl -sS -w ' code=%{http_code}\\n' " + e.url("http", "web.test", "/")
	want(t, "before crash", e.sh(t, sb.ID, get), "http-ok", "code=200")

	e.srv.crash()
	s2 := startServer(t, e.srv.State, e.serveArgs()...)
	e.c = client.New(s2.URL, e.key)
	got, err := e.c.Get(ctx, sb.ID)
	if err != nil || !got.Reattached || got.State != "running" {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	nw, err := e.c.Network(ctx, sb.ID)
	if err != nil || nw.Mode != "allowlist" || len(nw.Allow) != 2 || !nw.Listening || !nw.SecretsLost || len(nw.Secrets) != 1 {
		t.Fatalf("network after restart: %+v %v", nw, err)
	}
	want(t, "after restart", e.sh(t, sb.ID, get), "http-ok", "code=200")
	res := e.sh(t, sb.ID, "curl -sS -w ' code=%{http_code}\\n' "+e.url("http", "other.test", "/"))
	want(t, "after restart, old policy gone", res, "is not in network.allow", "code=403")
}

// TestNetworkRunCLI: airlock run --net uses the same proxy for a one-shot
// run: an allowed name is reachable over HTTP, HTTPS and SOCKS5, others are
// refused with the reason (printed by airlock too), direct connections
// fail, and --secret injects a header the program never sees.
func TestNetworkRunCLI(t *testing.T) {
	e := startLocalServers(t) // no airlock serve
	bin := airlockBin(t)
	prog := fmt.Sprintf(`set -u
curl -sS %s
curl -sS --cacert /srv/test/ca.pem %s
curl -sS --socks5-hostname 127.0.0.1:1080 %s
curl -sS -w ' code=%%{http_code}\n' %s
curl -sS -w ' code=%%{http_code}\n' %s
curl -sS %s
python3 -c 'import socket; socket.create_connection(("127.0.0.1", %d), timeout=5)' 2>&1 | tail -1
env`,
		e.url("http", "web.test", "/run"), e.url("https", "tls.test", "/run"), e.url("http", "web.test", "/socks"),
		e.url("http", "other.test", "/"), e.url("http", "blocked.corp.test", "/"),
		e.url("https", "secret.test", "/secret"), e.echoPort)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), e.caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"run", "--mount", filepath.Join(dir, "ca.pem") + ":/srv/test/ca.pem",
		"--net", "allow:web.test,tls.test,secret.test,*.corp.test,127.0.0.1", "--net", "deny:blocked.corp.test",
		"--secret", "secret.test:Authorization:env:AL_TEST_SECRET"}, e.serveArgs()...)
	cmd := exec.Command(bin, append(args, "--", "sh", "-c", prog)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "AL_TEST_SECRET=" + testSecret}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("airlock run: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, s := range []string{"http-ok host=web.test:", "https-ok sni=tls.test", "airlock: other.test is not in network.allow",
		"matches network.deny entry blocked.corp.test", "auth-ok sni=secret.test", "ConnectionRefusedError",
		"HTTP_PROXY=http://127.0.0.1:3128", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"} {
		if !strings.Contains(out, s) {
			t.Errorf("airlock run output lacks %q:\n%s\nstderr: %s", s, out, stderr.String())
		}
	}
	if strings.Count(out, "http-ok host=web.test:") != 2 {
		t.Errorf("HTTP and SOCKS5 answers:\n%s", out)
	}
	if !strings.Contains(stderr.String(), "airlock: network: denied: other.test is not in network.allow") {
		t.Errorf("airlock run did not report the denial:\n%s", stderr.String())
	}
	assertNoSecret(t, "airlock run output", out)
	if _, auths := e.seen(); len(auths) != 1 || auths[0] != testSecret {
		t.Errorf("HTTPS server saw %q", auths)
	}
	// The temporary trust store is gone.
	if m, _ := filepath.Glob(filepath.Join(os.TempDir(), "airlock-net-*")); len(m) != 0 {
		t.Errorf("temporary trust stores left behind: %v", m)
	}

	// Bad flags are usage errors that do not echo a secret value.
	for _, bad := range [][]string{{"--net", "allow:"}, {"--net", "none", "--net", "open"}, {"--net", "allow:10.1.2.3/8"},
		{"--net", "sideways"}, {"--secret", "secret.test:Authorization:" + testSecret}, {"--resolve", "web.test"}} {
		cmd := exec.Command(bin, append(append([]string{"run"}, bad...), "--", "true")...)
		var se strings.Builder
		cmd.Stderr = &se
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 125 {
			t.Errorf("airlock run %v: %v (%s), want exit 125", bad, err, se.String())
		}
		assertNoSecret(t, "usage error", se.String())
	}
}

// TestNetworkByteBudget: serve --egress-max-bytes caps what a sandbox may
// exchange through the proxy; once used up, connections are refused with
// the reason.
func TestNetworkByteBudget(t *testing.T) {
	e := startNetEnv(t, "--egress-max-bytes", "100K", "--egress-max-conns", "4")
	sb := e.create(t, &client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}})
	big := e.url("http", "web.test", "/big")
	res := e.sh(t, sb.ID, "for i in 1 2 3; do curl -sS -o /dev/null -w 'code=%{http_code} size=%{size_download}\\n' "+big+" 2>&1; done; curl -sS "+big)
	want(t, "budget", res, "code=200 size=65536", "this sandbox has used its network budget of 102400 bytes")
	if strings.Count(res.Stdout, "size=65536") != 1 {
		t.Errorf("more than one full download within a 100K budget:\n%s", res.Stdout)
	}
	e.waitLog(t, sb.ID, "budget refusal logged", func(log []client.Connection) bool {
		return hasConn(log, "web.test", e.httpPort, false, "network budget")
	})
}
