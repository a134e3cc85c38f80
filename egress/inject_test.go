package egress

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func injectSandbox(hosts ...string) Sandbox {
	sb := Sandbox{Policy: loopbackOK("plain.test")}
	for _, h := range hosts {
		sb.Secrets = append(sb.Secrets, Secret{Host: h, Header: "Authorization", Value: testSecret})
	}
	return sb
}

// sandboxRoots is the trust store the sandbox gets: its own CA only.
func sandboxRoots(t *testing.T, tp *testProxy) *x509.CertPool {
	t.Helper()
	pemBytes := tp.p.CACertPEM(tp.id)
	if pemBytes == nil {
		t.Fatal("no CA for a sandbox with secrets")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		t.Fatal("CACertPEM is not a PEM certificate")
	}
	return pool
}

// TestInjectHTTPS: the header reaches the HTTPS test server, which checks
// it, over one keep-alive CONNECT; the client never sees the value.
func TestInjectHTTPS(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, injectSandbox("secure.test"))
	roots := sandboxRoots(t, tp)
	c, tr := tp.client(t, roots)
	base := fmt.Sprintf("https://secure.test:%d", u.httpsPort)

	var seen bytes.Buffer // everything the client received
	for _, path := range []string{"/auth", "/echo", "/auth"} {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer sandbox-placeholder") // replaced by the proxy
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Header.Write(&seen)
		seen.Write(body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %q", path, resp.StatusCode, body)
		}
		if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; !strings.HasPrefix(iss, "airlock egress CA") {
			t.Errorf("served by a certificate from %q", iss)
		}
		if path == "/echo" {
			if !strings.Contains(string(body), "Authorization: "+strings.Repeat("*", len(testSecret))+"\r\n") {
				t.Errorf("echoed body not masked: %q", body)
			}
			if h := resp.Header.Get("X-Echo-Authorization"); h != "[redacted by airlock]" {
				t.Errorf("echoed header %q", h)
			}
		}
	}
	tr.CloseIdleConnections()
	wantNoSecret(t, "responses seen by the sandbox", seen.String())
	for _, a := range u.sawAuth() {
		if a != testSecret {
			t.Errorf("upstream saw Authorization %q", a)
		}
	}
	u.mu.Lock()
	if len(u.remotes) != 1 {
		t.Errorf("upstream saw %d connections, want 1 (keep-alive): %v", len(u.remotes), u.remotes)
	}
	u.mu.Unlock()
	rec := tp.rec.next(t)
	if !rec.Allowed || rec.Protocol != "connect+inject" || rec.Host != "secure.test" {
		t.Errorf("record %+v", rec)
	}
	wantNoSecret(t, "the record", fmt.Sprintf("%+v", rec))

	// A host without a secret in the same sandbox is tunneled untouched.
	c2, tr2 := tp.client(t, u.ca.pool)
	resp, err := c2.Get(fmt.Sprintf("https://plain.test:%d/echo", u.httpsPort))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tr2.CloseIdleConnections()
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != "upstream test CA" {
		t.Errorf("plain.test intercepted (issuer %q)", iss)
	}
	if rec := tp.rec.next(t); rec.Protocol != "connect" {
		t.Errorf("record %+v", rec)
	}
}

// TestInjectHostMismatch: inside an intercepted tunnel, a Host header
// naming another server is refused, so the secret cannot be steered to a
// different virtual host behind the same address.
func TestInjectHostMismatch(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, injectSandbox("secure.test"))
	resp, _, conn, br := tp.connectRaw(t, hostPort("secure.test", u.httpsPort))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	tc := tls.Client(&bufConn{Conn: conn, r: br}, &tls.Config{ServerName: "secure.test", RootCAs: sandboxRoots(t, tp)})
	fmt.Fprintf(tc, "GET /auth HTTP/1.1\r\nHost: plain.test\r\n\r\n")
	r, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode != http.StatusMisdirectedRequest || !strings.Contains(r.Header.Get("X-Airlock-Deny-Reason"), `Host header "plain.test" does not name secure.test:`) {
		t.Errorf("%d %q", r.StatusCode, r.Header.Get("X-Airlock-Deny-Reason"))
	}
	if n := len(u.sawAuth()); n != 0 {
		t.Errorf("upstream received %d requests", n)
	}
}

func TestInjectPlainHTTP(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, injectSandbox("allowed.test"))
	status, body, _ := tp.get(t, nil, fmt.Sprintf("http://allowed.test:%d/auth", u.httpPort))
	if status != 200 || body != "authorized\n" {
		t.Errorf("/auth: %d %q", status, body)
	}
	status, body, hdr := tp.get(t, nil, fmt.Sprintf("http://allowed.test:%d/echo", u.httpPort))
	if status != 200 {
		t.Errorf("/echo: %d", status)
	}
	var h bytes.Buffer
	hdr.Write(&h)
	wantNoSecret(t, "echo response", h.String()+body)
	if rec := tp.rec.next(t); rec.Protocol != "http+inject" {
		t.Errorf("record %+v", rec)
	}
}

func TestInjectOverSOCKS(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, injectSandbox("secure.test"))
	_, c := socksDial(t, tp.socksAddr, 3, "secure.test", u.httpsPort)
	if c == nil {
		t.Fatal("refused")
	}
	tc := tls.Client(c, &tls.Config{ServerName: "secure.test", RootCAs: sandboxRoots(t, tp)})
	fmt.Fprintf(tc, "GET /auth HTTP/1.1\r\nHost: secure.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "authorized\n" {
		t.Errorf("%d %q", resp.StatusCode, body)
	}
	tc.Close()
	if rec := tp.rec.next(t); rec.Protocol != "socks5+inject" || !rec.Allowed {
		t.Errorf("record %+v", rec)
	}
}

// TestInjectUpstreamUnverified: the proxy verifies the real upstream before
// sending it a secret.
func TestInjectUpstreamUnverified(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, injectSandbox("secure.test"), func(c *Config) { c.RootCAs = x509.NewCertPool() })
	status, body, _ := tp.get(t, sandboxRoots(t, tp), fmt.Sprintf("https://secure.test:%d/auth", u.httpsPort))
	if status != http.StatusBadGateway || !strings.Contains(body, "TLS to secure.test") || !strings.Contains(body, "certificate") {
		t.Errorf("%d %q", status, body)
	}
	if n := len(u.sawAuth()); n != 0 {
		t.Errorf("unverified upstream received %d requests", n)
	}
	if rec := tp.rec.next(t); !strings.Contains(rec.Reason, "certificate") {
		t.Errorf("record %+v", rec)
	}
}

// TestSandboxCA checks the CA's shape and that its name constraints keep
// it from vouching for any host but the secrets' hosts.
func TestSandboxCA(t *testing.T) {
	p := New(Config{CAValidity: 48 * time.Hour})
	defer p.Close()
	if err := p.AddSandbox("s", Sandbox{Secrets: []Secret{
		{Host: "api.example.com:443", Header: "Authorization", Value: testSecret},
		{Host: "*.corp.example", Header: "X-Api-Key", Value: "k-1234567890"},
	}}); err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(p.CACertPEM("s"))
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.IsCA || !ca.MaxPathLenZero || !ca.PermittedDNSDomainsCritical || time.Until(ca.NotAfter) > 48*time.Hour {
		t.Errorf("CA %+v", ca)
	}
	if got := strings.Join(ca.PermittedDNSDomains, ","); got != "api.example.com,.corp.example" {
		t.Errorf("permitted domains %q", got)
	}
	if k, ok := ca.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("CA key %T, want ECDSA P-256", ca.PublicKey)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	sb := p.sandbox("s")
	for host, ok := range map[string]bool{"api.example.com": true, "x.corp.example": true, "evil.example": false, "corp.example": false} {
		leaf, err := sb.ca.leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots})
		if (err == nil) != ok {
			t.Errorf("leaf for %s: verify error %v, want ok=%v", host, err, ok)
		}
		again, _ := sb.ca.leaf(host)
		if again != leaf {
			t.Errorf("leaf for %s not cached", host)
		}
	}
}

func TestMasker(t *testing.T) {
	pats := [][]byte{[]byte("sk-secret-123"), []byte("Bearer sk-secret-123")}
	in := "a sk-secret-123 b Bearer sk-secret-123 c sk-secret-12 d sk-secret-123"
	want := "a ************* b ******************** c sk-secret-12 d *************"
	for name, r := range map[string]io.Reader{
		"whole":    strings.NewReader(in),
		"one byte": iotest.OneByteReader(strings.NewReader(in)),
		"half":     iotest.HalfReader(strings.NewReader(in)),
	} {
		got, err := io.ReadAll(iotest.OneByteReader(newMasker(io.NopCloser(r), pats)))
		if err != nil || string(got) != want {
			t.Errorf("%s: %q, %v\nwant %q", name, got, err, want)
		}
	}
}
