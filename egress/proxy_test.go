package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
)

// loopbackOK is an allowlist for allowed.test that also names 127.0.0.1,
// which the test names resolve to: without it the proxy refuses them.
func loopbackOK(extra ...string) Policy {
	return Policy{Mode: ModeAllowlist, Allow: append([]string{"allowed.test", "echo.test", "secure.test", "127.0.0.1"}, extra...)}
}

func TestHTTPAbsoluteURI(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK()})
	url := fmt.Sprintf("http://allowed.test:%d/hello", u.httpPort)

	// Two requests on one keep-alive connection to the proxy.
	c, tr := tp.client(t, nil)
	for i := 0; i < 2; i++ {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != fmt.Sprintf("hello from allowed.test:%d /hello\n", u.httpPort) {
			t.Fatalf("GET %s = %d %q", url, resp.StatusCode, b)
		}
	}
	tr.CloseIdleConnections()
	rec := tp.rec.next(t)
	if !rec.Allowed || rec.Host != "allowed.test" || rec.Port != u.httpPort || rec.Protocol != "http" ||
		rec.Addr != hostPort("127.0.0.1", u.httpPort) || rec.BytesUp == 0 || rec.BytesDown == 0 {
		t.Errorf("record %+v", rec)
	}
	if !strings.Contains(rec.Reason, "matches network.allow entry allowed.test") || !strings.Contains(rec.Reason, "named by network.allow entry 127.0.0.1") {
		t.Errorf("reason %q", rec.Reason)
	}
}

func TestHTTPSConnectTunnel(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK()})
	c, tr := tp.client(t, u.ca.pool)
	resp, err := c.Get(fmt.Sprintf("https://secure.test:%d/hello", u.httpsPort))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	tr.CloseIdleConnections()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "hello from secure.test") {
		t.Fatalf("got %d %q", resp.StatusCode, b)
	}
	// Without a secret the tunnel is untouched: the client saw the
	// upstream's own certificate.
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != "upstream test CA" {
		t.Errorf("certificate issued by %q: the proxy intercepted a tunnel without a secret", iss)
	}
	rec := tp.rec.next(t)
	if !rec.Allowed || rec.Protocol != "connect" || rec.Host != "secure.test" || rec.BytesDown == 0 {
		t.Errorf("record %+v", rec)
	}
}

func TestSOCKS5(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK("::1")})

	_, c := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort)
	if c == nil {
		t.Fatal("SOCKS5 CONNECT to echo.test refused")
	}
	if got := roundTrip(t, c, "ping by name"); got != "ping by name" {
		t.Errorf("echo %q", got)
	}
	c.Close()
	if rec := tp.rec.next(t); !rec.Allowed || rec.Protocol != "socks5" || rec.Host != "echo.test" || rec.BytesUp != 12 || rec.BytesDown != 12 {
		t.Errorf("record %+v", rec)
	}

	_, c = socksDial(t, tp.socksAddr, 1, "127.0.0.1", u.echoPort)
	if c == nil {
		t.Fatal("SOCKS5 CONNECT to 127.0.0.1 refused")
	}
	if got := roundTrip(t, c, "ping by IPv4"); got != "ping by IPv4" {
		t.Errorf("echo %q", got)
	}
	c.Close()
	tp.rec.next(t)

	// An HTTP request through a SOCKS tunnel, name resolved by the proxy.
	_, c = socksDial(t, tp.socksAddr, 3, "allowed.test", u.httpPort)
	fmt.Fprintf(c, "GET /hello HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("HTTP over SOCKS: %v %v", resp, err)
	}
	c.Close()
	tp.rec.next(t)

	if u.echo6Port == 0 {
		t.Log("no IPv6 loopback: skipping the IPv6 address type")
		return
	}
	_, c = socksDial(t, tp.socksAddr, 4, "::1", u.echo6Port)
	if c == nil {
		t.Fatal("SOCKS5 CONNECT to ::1 refused")
	}
	if got := roundTrip(t, c, "ping by IPv6"); got != "ping by IPv6" {
		t.Errorf("echo %q", got)
	}
	c.Close()
	if rec := tp.rec.next(t); !rec.Allowed || rec.Host != "::1" || rec.Addr != hostPort("::1", u.echo6Port) {
		t.Errorf("record %+v", rec)
	}
}

func TestDenied(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK()})
	const reason = "denied: denied.test is not in network.allow; add denied.test to network.allow to permit it"
	// The program sees "airlock: ..." in the status line and the body.
	const said = "airlock: denied.test is not in network.allow; add denied.test to network.allow to permit it"

	// HTTP absolute URI.
	status, body, hdr := tp.get(t, nil, fmt.Sprintf("http://denied.test:%d/", u.httpPort))
	if status != http.StatusForbidden || body != said+"\n" || hdr.Get("X-Airlock-Deny-Reason") != reason {
		t.Errorf("HTTP: %d %q %q", status, body, hdr.Get("X-Airlock-Deny-Reason"))
	}
	if rec := tp.rec.next(t); rec.Allowed || rec.Reason != reason || rec.Host != "denied.test" || rec.Addr != "" {
		t.Errorf("HTTP record %+v", rec)
	}

	// CONNECT.
	resp, body, _, _ := tp.connectRaw(t, hostPort("denied.test", u.httpsPort))
	if resp.StatusCode != http.StatusForbidden || resp.Status != "403 "+said || body != said+"\n" || resp.Header.Get("X-Airlock-Deny-Reason") != reason {
		t.Errorf("CONNECT: %q %q", resp.Status, body)
	}
	if rec := tp.rec.next(t); rec.Allowed || rec.Protocol != "connect" || rec.Reason != reason {
		t.Errorf("CONNECT record %+v", rec)
	}

	// The Go client reports the refusal as an error.
	c, _ := tp.client(t, u.ca.pool)
	if _, err := c.Get(fmt.Sprintf("https://denied.test:%d/", u.httpsPort)); err == nil || !strings.Contains(err.Error(), said) {
		t.Errorf("HTTPS to denied.test: %v", err)
	}
	tp.rec.next(t)

	// SOCKS5: reply 0x02, connection not allowed by ruleset.
	if code, _ := socksDial(t, tp.socksAddr, 3, "denied.test", u.echoPort); code != 0x02 {
		t.Errorf("SOCKS5 reply %#x, want 0x02", code)
	}
	if rec := tp.rec.next(t); rec.Allowed || rec.Protocol != "socks5" || rec.Reason != reason {
		t.Errorf("SOCKS record %+v", rec)
	}
	// An IP literal outside the allowlist.
	if code, _ := socksDial(t, tp.socksAddr, 1, "127.0.0.2", u.echoPort); code != 0x02 {
		t.Errorf("SOCKS5 to 127.0.0.2: reply %#x, want 0x02", code)
	}
	if rec := tp.rec.next(t); rec.Allowed || !strings.Contains(rec.Reason, "127.0.0.2 is not in network.allow") {
		t.Errorf("record %+v", rec)
	}
}

func TestDenyBeatsAllow(t *testing.T) {
	u := startUpstreams(t)
	pol := loopbackOK("*.test")
	pol.Deny = []string{"echo.test"}
	tp := startProxy(t, u, Sandbox{Policy: pol})
	if code, _ := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort); code != 0x02 {
		t.Errorf("SOCKS5 reply %#x, want 0x02", code)
	}
	rec := tp.rec.next(t)
	if rec.Allowed || !strings.Contains(rec.Reason, "matches network.deny entry echo.test (deny wins over allow)") {
		t.Errorf("record %+v", rec)
	}
	// The same destination by address is denied by an address entry.
	pol.Deny = []string{"127.0.0.1:" + fmt.Sprint(u.echoPort)}
	if err := tp.p.SetPolicy(tp.id, pol); err != nil {
		t.Fatal(err)
	}
	if code, _ := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort); code != 0x02 {
		t.Errorf("SOCKS5 reply %#x, want 0x02", code)
	}
	if rec := tp.rec.next(t); rec.Allowed || !strings.Contains(rec.Reason, "echo.test resolves to 127.0.0.1, which matches network.deny entry 127.0.0.1:") {
		t.Errorf("record %+v", rec)
	}
}

// TestLoopbackNeedsExplicitAllow is the DNS-rebinding case end to end: an
// allowlisted name that resolves to 127.0.0.1 is refused until the policy
// names 127.0.0.1, and the change applies to the next connection.
func TestLoopbackNeedsExplicitAllow(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: Policy{Mode: ModeAllowlist, Allow: []string{"allowed.test", "mixed.test"}}})
	url := fmt.Sprintf("http://allowed.test:%d/hello", u.httpPort)
	const reason = "denied: allowed.test resolves to 127.0.0.1, a loopback address; add 127.0.0.1 to network.allow to permit it"

	status, body, _ := tp.get(t, nil, url)
	if status != http.StatusForbidden || body != clientReason(reason)+"\n" {
		t.Errorf("got %d %q", status, body)
	}
	if rec := tp.rec.next(t); rec.Allowed || rec.Reason != reason {
		t.Errorf("record %+v", rec)
	}
	if code, _ := socksDial(t, tp.socksAddr, 3, "allowed.test", u.echoPort); code != 0x02 {
		t.Errorf("SOCKS5 reply %#x", code)
	}
	tp.rec.next(t)
	// IP literals are checked too, including their IPv4-mapped form.
	for _, lit := range []string{"127.0.0.1", "[::ffff:127.0.0.1]"} {
		status, _, _ = tp.get(t, nil, fmt.Sprintf("http://%s:%d/", lit, u.httpPort))
		if status != http.StatusForbidden {
			t.Errorf("%s: status %d", lit, status)
		}
		tp.rec.next(t)
	}

	if err := tp.p.SetPolicy(tp.id, Policy{Mode: ModeAllowlist, Allow: []string{"allowed.test", "mixed.test", "127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	if status, _, _ := tp.get(t, nil, url); status != 200 {
		t.Errorf("after allowing 127.0.0.1: status %d", status)
	}
	if rec := tp.rec.next(t); !rec.Allowed {
		t.Errorf("record %+v", rec)
	}
	// A name with one public-looking and one private address is refused
	// as a whole.
	status, body, _ = tp.get(t, nil, fmt.Sprintf("http://mixed.test:%d/", u.httpPort))
	if status != http.StatusForbidden || !strings.Contains(body, "mixed.test resolves to 10.0.0.1, a private address (RFC 1918)") {
		t.Errorf("mixed.test: %d %q", status, body)
	}
	tp.rec.next(t)
}

func TestPolicyChangeNextConnection(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK()})
	_, held := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort)
	if held == nil {
		t.Fatal("refused")
	}
	if err := tp.p.SetPolicy(tp.id, Policy{Mode: ModeNone}); err != nil {
		t.Fatal(err)
	}
	// The next connection is judged by the new policy...
	if code, _ := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort); code != 0x02 {
		t.Errorf("after switching to none: reply %#x", code)
	}
	if rec := tp.rec.next(t); rec.Allowed || !strings.Contains(rec.Reason, `network mode is "none"`) {
		t.Errorf("record %+v", rec)
	}
	// ...while the established one keeps working.
	if got := roundTrip(t, held, "still here"); got != "still here" {
		t.Errorf("held connection: %q", got)
	}
	held.Close()
	tp.rec.next(t)

	// On an HTTP keep-alive connection the next request is judged again.
	if err := tp.p.SetPolicy(tp.id, loopbackOK()); err != nil {
		t.Fatal(err)
	}
	c, tr := tp.client(t, nil)
	url := fmt.Sprintf("http://allowed.test:%d/", u.httpPort)
	resp, err := c.Get(url)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err := tp.p.SetPolicy(tp.id, Policy{Mode: ModeAllowlist, Allow: []string{"127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	resp, err = c.Get(url)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("after removing allowed.test: %v %v", resp, err)
	}
	resp.Body.Close()
	tr.CloseIdleConnections()
	if first, second := tp.rec.next(t), tp.rec.next(t); !first.Allowed || second.Allowed {
		t.Errorf("records %+v then %+v", first, second)
	}

	if err := tp.p.SetPolicy(tp.id, Policy{Mode: "bogus"}); err == nil {
		t.Error("SetPolicy accepted an invalid policy")
	}
	if err := tp.p.SetPolicy("no-such-sandbox", Policy{}); err == nil {
		t.Error("SetPolicy accepted an unknown sandbox")
	}
}

func TestOnConnectionSeesEveryAttempt(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK()})
	type want struct {
		host    string
		allowed bool
		proto   string
	}
	var wants []want

	tp.get(t, nil, fmt.Sprintf("http://allowed.test:%d/", u.httpPort))
	wants = append(wants, want{"allowed.test", true, "http"})
	tp.get(t, nil, fmt.Sprintf("http://denied.test:%d/", u.httpPort))
	wants = append(wants, want{"denied.test", false, "http"})
	tp.get(t, u.ca.pool, fmt.Sprintf("https://secure.test:%d/", u.httpsPort))
	wants = append(wants, want{"secure.test", true, "connect"})
	tp.connectRaw(t, hostPort("nowhere.test", 443))
	wants = append(wants, want{"nowhere.test", false, "connect"})
	_, c := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort)
	roundTrip(t, c, "x")
	c.Close()
	wants = append(wants, want{"echo.test", true, "socks5"})
	socksDial(t, tp.socksAddr, 3, "denied.test", u.echoPort)
	wants = append(wants, want{"denied.test", false, "socks5"})
	// Allowed by policy but not resolvable: allowed, with the failure in
	// the reason and a 502.
	if err := tp.p.SetPolicy(tp.id, loopbackOK("unknown.test")); err != nil {
		t.Fatal(err)
	}
	status, body, _ := tp.get(t, nil, "http://unknown.test/")
	if status != http.StatusBadGateway || !strings.HasPrefix(body, "airlock: cannot resolve unknown.test") {
		t.Errorf("unknown.test: %d %q", status, body)
	}
	wants = append(wants, want{"unknown.test", true, "http"})
	if code, _ := socksDial(t, tp.socksAddr, 3, "unknown.test", 80); code != 0x04 {
		t.Errorf("SOCKS5 to unresolvable name: reply %#x, want 0x04", code)
	}
	wants = append(wants, want{"unknown.test", true, "socks5"})

	// Records arrive when connections end; order them by start.
	recs := make([]Record, len(wants))
	for i := range recs {
		recs[i] = tp.rec.next(t)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Time.Before(recs[j].Time) })
	for i, w := range wants {
		rec := recs[i]
		if rec.Host != w.host || rec.Allowed != w.allowed || rec.Protocol != w.proto || rec.SandboxID != tp.id ||
			rec.Time.IsZero() || rec.Duration <= 0 || rec.Reason == "" {
			t.Errorf("record %d = %+v, want %+v", i, rec, w)
		}
		if rec.Allowed && rec.Host != "unknown.test" && (rec.BytesUp == 0 || rec.BytesDown == 0) {
			t.Errorf("record %d counts no bytes: %+v", i, rec)
		}
	}
	select {
	case rec := <-tp.rec.ch:
		t.Errorf("unexpected extra record %+v", rec)
	default:
	}
}

func TestMaxConns(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK(), Limits: Limits{MaxConns: 1}})
	_, held := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort)
	if held == nil {
		t.Fatal("first connection refused")
	}
	roundTrip(t, held, "a")
	if code, _ := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort); code != 0x02 {
		t.Errorf("second connection: reply %#x, want 0x02", code)
	}
	if rec := tp.rec.next(t); rec.Allowed || !strings.Contains(rec.Reason, "already has 1 open connections") {
		t.Errorf("record %+v", rec)
	}
	status, body, _ := tp.get(t, nil, fmt.Sprintf("http://allowed.test:%d/", u.httpPort))
	if status != http.StatusForbidden || !strings.Contains(body, "its limit") {
		t.Errorf("HTTP at the cap: %d %q", status, body)
	}
	tp.rec.next(t)
	held.Close()
	if rec := tp.rec.next(t); !rec.Allowed {
		t.Errorf("record %+v", rec)
	}
	// The slot is free again once the first connection has ended.
	_, c := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort)
	if c == nil {
		t.Fatal("connection after the first one ended was refused")
	}
	roundTrip(t, c, "b")
}

func TestMaxBytes(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK(), Limits: Limits{MaxBytes: 1000}})
	_, c := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort)
	if c == nil {
		t.Fatal("refused")
	}
	if got := roundTrip(t, c, strings.Repeat("a", 400)); len(got) != 400 {
		t.Fatal(len(got))
	}
	// 800 of 1000 bytes used: this write crosses the budget, and the
	// connection is closed after at most the remaining bytes.
	io.WriteString(c, strings.Repeat("b", 400))
	got, _ := io.ReadAll(c)
	if len(got) > 200 {
		t.Errorf("read %d bytes past the budget", len(got))
	}
	rec := tp.rec.next(t)
	if !rec.Allowed || !strings.Contains(rec.Reason, "budget of 1000 bytes is used up") || rec.BytesUp+rec.BytesDown != 1000 {
		t.Errorf("record %+v", rec)
	}
	if used := tp.p.BytesUsed(tp.id); used != 1000 {
		t.Errorf("BytesUsed = %d", used)
	}
	if code, _ := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort); code != 0x02 {
		t.Errorf("after the budget: reply %#x, want 0x02", code)
	}
	if rec := tp.rec.next(t); rec.Allowed || !strings.Contains(rec.Reason, "used its network budget of 1000 bytes") {
		t.Errorf("record %+v", rec)
	}
}

func TestUnknownSandbox(t *testing.T) {
	tp := startProxy(t, nil, Sandbox{Policy: Policy{Mode: ModeOpen}})
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		tp.p.ServeConn(context.Background(), "ghost", b, HTTP)
		close(done)
	}()
	fmt.Fprintf(a, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(a), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(resp.Header.Get("X-Airlock-Deny-Reason"), `sandbox "ghost" is not registered`) {
		t.Errorf("%d %q", resp.StatusCode, resp.Header.Get("X-Airlock-Deny-Reason"))
	}
	a.Close()
	<-done
	if rec := tp.rec.next(t); rec.SandboxID != "ghost" || rec.Allowed {
		t.Errorf("record %+v", rec)
	}
}

// TestServeConnOverPipe drives ServeConn with a connection that is not a
// socket, as the agent bridge will, and ends it through its context.
func TestServeConnOverPipe(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK()})
	a, b := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		tp.p.ServeConn(ctx, tp.id, b, SOCKS5)
		close(done)
	}()
	code, err := socksHandshake(a, 3, "echo.test", u.echoPort)
	if err != nil || code != 0 {
		t.Fatalf("reply %#x, %v", code, err)
	}
	if got := roundTrip(t, a, "over a pipe"); got != "over a pipe" {
		t.Errorf("echo %q", got)
	}
	cancel()
	<-done
	if rec := tp.rec.next(t); !rec.Allowed || rec.BytesUp != 11 {
		t.Errorf("record %+v", rec)
	}
}

func TestRemoveSandboxClosesConnections(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK()})
	_, c := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort)
	roundTrip(t, c, "x")
	tp.p.RemoveSandbox(tp.id)
	if _, err := io.ReadAll(c); err != nil {
		t.Logf("read after removal: %v", err)
	}
	tp.rec.next(t)
	if code, _ := socksDial(t, tp.socksAddr, 3, "echo.test", u.echoPort); code != 0x02 {
		t.Errorf("after removal: reply %#x", code)
	}
}

func TestUpgradeThroughHTTPProxy(t *testing.T) {
	u := startUpstreams(t)
	tp := startProxy(t, u, Sandbox{Policy: loopbackOK()})
	c, err := net.Dial("tcp", tp.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET http://allowed.test:%d/upgrade HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", u.httpPort)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("%v %v", resp, err)
	}
	io.WriteString(c, "upgraded")
	b := make([]byte, 8)
	if _, err := io.ReadFull(br, b); err != nil || string(b) != "upgraded" {
		t.Errorf("%q %v", b, err)
	}
}

func TestBadRequests(t *testing.T) {
	tp := startProxy(t, nil, Sandbox{Policy: Policy{Mode: ModeOpen}})
	cases := []struct{ req, want string }{
		{"GET /path HTTP/1.1\r\nHost: x\r\n\r\n", "this is a proxy"},
		{"GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", "CONNECT tunnel"},
		{"CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n", "CONNECT needs host:port"},
		{"CONNECT bad_host!:443 HTTP/1.1\r\nHost: x\r\n\r\n", "contains"},
		{"garbage\r\n\r\n", "malformed proxy request"},
	}
	for _, c := range cases {
		conn, err := net.Dial("tcp", tp.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, c.req)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil {
			t.Errorf("%q: %v", c.req, err)
			continue
		}
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(resp.Header.Get("X-Airlock-Deny-Reason"), c.want) {
			t.Errorf("%q: %d %q", c.req, resp.StatusCode, resp.Header.Get("X-Airlock-Deny-Reason"))
		}
		if rec := tp.rec.next(t); rec.Allowed {
			t.Errorf("record %+v", rec)
		}
	}
}

func TestAddSandboxValidates(t *testing.T) {
	p := New(Config{})
	defer p.Close()
	if err := p.AddSandbox("a", Sandbox{Policy: Policy{Mode: "allowlist", Allow: []string{"*"}}}); err == nil {
		t.Error("accepted a bad policy")
	}
	bad := []Secret{
		{Host: "10.0.0.0/8", Header: "Authorization", Value: "x"},
		{Host: "api.example", Header: "Bad Header", Value: "x"},
		{Host: "api.example", Header: "Host", Value: "x"},
		{Host: "api.example", Header: "Authorization", Value: "a\r\nX-Evil: 1"},
		{Host: "api.example", Header: "Authorization", Value: ""},
	}
	for _, s := range bad {
		if err := p.AddSandbox("b", Sandbox{Secrets: []Secret{s}}); err == nil {
			t.Errorf("accepted %v", s)
		}
	}
	if err := p.AddSandbox("c", Sandbox{}); err != nil {
		t.Fatal(err)
	}
	if err := p.AddSandbox("c", Sandbox{}); err == nil {
		t.Error("accepted a duplicate ID")
	}
	if p.CACertPEM("c") != nil {
		t.Error("a sandbox without secrets has a CA")
	}
	if s := fmt.Sprintf("%v %+v %#v", bad[0], bad[0], bad[0]); strings.Contains(s, `"x"`) || !strings.Contains(s, "redacted") {
		t.Errorf("Secret formatting shows the value: %s", s)
	}
}
func TestProxyEnv(t *testing.T) {
	got := strings.Join(ProxyEnv(3128, 1080), " ")
	for _, want := range []string{
		"HTTP_PROXY=http://127.0.0.1:3128", "http_proxy=http://127.0.0.1:3128",
		"HTTPS_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128",
		"ALL_PROXY=socks5h://127.0.0.1:1080", "all_proxy=socks5h://127.0.0.1:1080",
		"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("ProxyEnv lacks %s: %s", want, got)
		}
	}
	if env := strings.Join(ProxyEnv(3128, 0), " "); strings.Contains(env, "ALL_PROXY") {
		t.Errorf("ProxyEnv(3128, 0) sets ALL_PROXY: %s", env)
	}
}

func TestSOCKSProtocolErrors(t *testing.T) {
	tp := startProxy(t, nil, Sandbox{Policy: Policy{Mode: ModeOpen}})
	exchange := func(greeting, req []byte) []byte {
		t.Helper()
		c, err := net.Dial("tcp", tp.socksAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(greeting)
		if req == nil {
			b, _ := io.ReadAll(c)
			return b
		}
		sel := make([]byte, 2)
		if _, err := io.ReadFull(c, sel); err != nil || sel[1] != 0 {
			t.Fatalf("method selection %v %v", sel, err)
		}
		c.Write(req)
		b, _ := io.ReadAll(c)
		return b
	}
	// Only username/password offered: no acceptable method.
	if got := exchange([]byte{5, 1, 2}, nil); len(got) != 2 || got[1] != 0xff {
		t.Errorf("no-auth missing: %v", got)
	}
	if rec := tp.rec.next(t); rec.Allowed || !strings.Contains(rec.Reason, "no acceptable method") {
		t.Errorf("record %+v", rec)
	}
	// BIND is not supported.
	if got := exchange([]byte{5, 1, 0}, []byte{5, 2, 0, 1, 127, 0, 0, 1, 0, 80}); len(got) < 2 || got[1] != 0x07 {
		t.Errorf("BIND: %v", got)
	}
	tp.rec.next(t)
	// Unknown address type.
	if got := exchange([]byte{5, 1, 0}, []byte{5, 1, 0, 9, 0, 0}); len(got) < 2 || got[1] != 0x08 {
		t.Errorf("address type 9: %v", got)
	}
	tp.rec.next(t)
	// A name that is not a host name.
	name := "bad name!"
	req := append([]byte{5, 1, 0, 3, byte(len(name))}, name...)
	if got := exchange([]byte{5, 1, 0}, append(req, 0, 80)); len(got) < 2 || got[1] != 0x02 {
		t.Errorf("bad name: %v", got)
	}
	if rec := tp.rec.next(t); rec.Allowed || !strings.Contains(rec.Reason, "contains") {
		t.Errorf("record %+v", rec)
	}
	// Special addresses are refused in open mode too, by IPv6 literal.
	if code, _ := socksDial(t, tp.socksAddr, 4, "::ffff:169.254.169.254", 80); code != 0x02 {
		t.Errorf("mapped metadata address: reply %#x", code)
	}
	if rec := tp.rec.next(t); !strings.Contains(rec.Reason, "cloud metadata service") {
		t.Errorf("record %+v", rec)
	}
}
