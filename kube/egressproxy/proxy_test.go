package egressproxy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// testSecretValue is the injected credential; it must reach the upstream
// and never the sandbox's side.
const testSecretValue = "Bearer k8s-test-secret-4f1c"

// upstream is a real HTTP and HTTPS server on 127.0.0.1. The HTTPS one has
// httptest's certificate (for example.com and its subdomains), trusted
// by the proxy through roots.
type upstream struct {
	httpPort, httpsPort int
	roots               *x509.CertPool

	mu   sync.Mutex
	auth []string
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.auth = append(u.auth, r.Header.Get("Authorization"))
		u.mu.Unlock()
		if r.URL.Path == "/auth" && r.Header.Get("Authorization") != testSecretValue {
			http.Error(w, "missing credential", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	})
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	ts := httptest.NewTLSServer(h)
	t.Cleanup(ts.Close)
	u.httpPort = hs.Listener.Addr().(*net.TCPAddr).Port
	u.httpsPort = ts.Listener.Addr().(*net.TCPAddr).Port
	u.roots = x509.NewCertPool()
	u.roots.AddCert(ts.Certificate())
	return u
}

// testResolver maps the test names to the loopback upstream.
var testResolver = egress.StaticResolver{
	"allowed.test":    {net.IPv4(127, 0, 0, 1)},
	"other.test":      {net.IPv4(127, 0, 0, 1)},
	"api.example.com": {net.IPv4(127, 0, 0, 1)},
}

// startServer runs a Server's HTTP listener on 127.0.0.1: every test
// connection comes from 127.0.0.1, the "pod IP" of the test pods.
func startServer(t *testing.T, u *upstream) (*Server, string) {
	s, addr, _ := startServerLog(t, u)
	return s, addr
}

// startServerLog is startServer with the proxy's log (every level) kept.
func startServerLog(t *testing.T, u *upstream) (*Server, string, *testserver.Output) {
	t.Helper()
	logs := &testserver.Output{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := New(Config{Egress: egress.Config{Resolver: testResolver, RootCAs: u.roots, Logger: log}})
	t.Cleanup(func() { s.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l, egress.HTTP)
	return s, l.Addr().String(), logs
}

// get fetches rawURL through the proxy at proxyAddr, trusting roots for
// HTTPS (the sandbox's trust store), and returns the status and body.
func get(t *testing.T, proxyAddr, rawURL string, roots *x509.CertPool) (int, string) {
	t.Helper()
	pu, _ := url.Parse("http://" + proxyAddr)
	tr := &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Get(rawURL)
	if err != nil {
		// A refused CONNECT surfaces as an error carrying the status.
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// sandboxPod is a Running sandbox pod at 127.0.0.1 with a network policy.
func sandboxPod(id string, uid types.UID, network string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: id, Namespace: "airlock-sandboxes", UID: uid,
			Labels:      map[string]string{LabelSandbox: id},
			Annotations: map[string]string{AnnotationNetwork: network},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"},
	}
}

const allowAllowed = `{"mode":"allowlist","allow":["allowed.test","api.example.com","127.0.0.1"]}`

func TestServerByPodIP(t *testing.T) {
	u := startUpstream(t)
	s, addr := startServer(t, u)
	allowed := fmt.Sprintf("http://allowed.test:%d/hello", u.httpPort)
	other := fmt.Sprintf("http://other.test:%d/hello", u.httpPort)

	// No pod has the IP: refused, with a reason.
	if code, body := get(t, addr, allowed, nil); code != 403 || !strings.Contains(body, "unknown source 127.0.0.1") {
		t.Fatalf("unknown source: %d %q", code, body)
	}

	a := sandboxPod("sb-a", "uid-a", allowAllowed)
	if err := s.SyncPod(a, nil); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, addr, allowed, nil); code != 200 || body != "hello /hello" {
		t.Fatalf("allowed host: %d %q", code, body)
	}
	if code, body := get(t, addr, other, nil); code != 403 || !strings.Contains(body, "other.test") {
		t.Fatalf("host outside the allowlist: %d %q", code, body)
	}

	// A policy change in the annotation applies to the next connection.
	a.Annotations[AnnotationNetwork] = `{"mode":"allowlist","allow":["other.test","127.0.0.1"]}`
	if err := s.SyncPod(a, nil); err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, addr, allowed, nil); code != 403 {
		t.Fatalf("after the policy change, allowed.test: %d", code)
	}
	if code, _ := get(t, addr, other, nil); code != 200 {
		t.Fatalf("after the policy change, other.test: %d", code)
	}

	// IP reuse: a second live pod claims the IP before the first is gone.
	// Neither policy is guessed: everything from the IP is refused.
	b := sandboxPod("sb-b", "uid-b", `{"mode":"open","allow":["127.0.0.1"]}`)
	if err := s.SyncPod(b, nil); err != nil {
		t.Fatal(err)
	}
	if id, reason := s.Lookup(netip.MustParseAddr("127.0.0.1")); id != "" || !strings.Contains(reason, "2 live pods") {
		t.Fatalf("ambiguous IP: %q %q", id, reason)
	}
	if code, _ := get(t, addr, other, nil); code != 403 {
		t.Fatalf("ambiguous IP served: %d", code)
	}
	// The old pod terminates: the IP is the new pod's, with its policy.
	now := metav1.Now()
	a.DeletionTimestamp = &now
	if err := s.SyncPod(a, nil); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.Lookup(netip.MustParseAddr("127.0.0.1")); id != "sb-b" {
		t.Fatalf("after the old pod went: %q", id)
	}
	if code, _ := get(t, addr, allowed, nil); code != 200 {
		t.Fatalf("open sandbox: %d", code)
	}
	// A pod that stopped running no longer owns its IP.
	b.Status.Phase = corev1.PodSucceeded
	s.SyncPod(b, nil)
	if code, _ := get(t, addr, allowed, nil); code != 403 {
		t.Fatalf("finished pod still served: %d", code)
	}

	// Every IP of a dual-stack pod identifies it.
	d := sandboxPod("sb-d", "uid-d", allowAllowed)
	d.Status.PodIP = "10.1.2.3"
	d.Status.PodIPs = []corev1.PodIP{{IP: "10.1.2.3"}, {IP: "fd00::1:2:3"}}
	s.SyncPod(d, nil)
	for _, ip := range []string{"10.1.2.3", "fd00::1:2:3", "::ffff:10.1.2.3"} {
		if id, reason := s.Lookup(netip.MustParseAddr(ip)); id != "sb-d" {
			t.Fatalf("dual-stack pod at %s: %q %q", ip, id, reason)
		}
	}
	s.ForgetPod("uid-d")
	if id, _ := s.Lookup(netip.MustParseAddr("fd00::1:2:3")); id != "" {
		t.Fatalf("forgotten dual-stack pod still maps: %q", id)
	}

	// A malformed annotation fails closed: registered, everything denied.
	c := sandboxPod("sb-c", "uid-c", `{"mode":"open"`)
	if err := s.SyncPod(c, nil); err == nil {
		t.Fatal("malformed annotation accepted")
	}
	if code, body := get(t, addr, allowed, nil); code != 403 || !strings.Contains(body, `network mode is "none"`) {
		t.Fatalf("malformed annotation: %d %q", code, body)
	}
	s.ForgetPod("uid-c")
	if id, _ := s.Lookup(netip.MustParseAddr("127.0.0.1")); id != "" {
		t.Fatalf("forgotten pod still maps: %q", id)
	}
}

// TestServerInjects: the egress Secret's header reaches the HTTPS upstream
// through the proxy, on a CONNECT the proxy intercepts with the Secret's CA;
// the sandbox side trusts that CA only and never sees the value.
func TestServerInjects(t *testing.T) {
	u := startUpstream(t)
	s, addr, logs := startServerLog(t, u)
	data, err := EgressSecretData("sb-inj", []egress.Secret{{Host: "api.example.com", Header: "Authorization", Value: testSecretValue}})
	if err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: EgressSecretName("sb-inj"), ResourceVersion: "1"}, Data: data}
	if err := s.SyncPod(sandboxPod("sb-inj", "uid-inj", allowAllowed), sec); err != nil {
		t.Fatal(err)
	}
	trust := x509.NewCertPool()
	if !trust.AppendCertsFromPEM(data[CACertKey]) {
		t.Fatal("ca.crt is not PEM")
	}
	target := fmt.Sprintf("https://api.example.com:%d/auth", u.httpsPort)
	code, body := get(t, addr, target, trust)
	if code != 200 || body != "hello /auth" {
		t.Fatalf("injected request: %d %q", code, body)
	}
	if strings.Contains(body, testSecretValue) {
		t.Fatal("the sandbox saw the secret")
	}
	// Without the Secret, the same request reaches the upstream without
	// the header (tunneled, not intercepted: the sandbox's trust store
	// would have to trust the upstream itself).
	if err := s.SyncPod(sandboxPod("sb-inj", "uid-inj", allowAllowed), nil); err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, addr, target, u.roots); code != 401 {
		t.Fatalf("without the Secret: %d, want the upstream's 401", code)
	}

	// A malformed Secret fails closed, and neither the error nor the log
	// quotes the value in it.
	sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: EgressSecretName("sb-inj"), ResourceVersion: "2"},
		Data: map[string][]byte{SecretsKey: []byte(`[{"host":"api.example.com","header":"Authorization","value":"` + testSecretValue + `"`)}}
	err = s.SyncPod(sandboxPod("sb-inj", "uid-inj", allowAllowed), sec)
	if err == nil || strings.Contains(err.Error(), testSecretValue) {
		t.Fatalf("malformed Secret: %v", err)
	}
	if code, _ := get(t, addr, fmt.Sprintf("http://allowed.test:%d/hello", u.httpPort), nil); code != 403 {
		t.Fatalf("malformed Secret: the sandbox still reaches its allowlist (%d)", code)
	}
	if strings.Contains(logs.String(), testSecretValue) || strings.Contains(logs.String(), strings.TrimPrefix(testSecretValue, "Bearer ")) {
		t.Fatalf("the proxy's log holds the secret:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "configuration refused") {
		t.Fatalf("the refusal is not logged:\n%s", logs.String())
	}
}

// socksConnect does a SOCKS5 CONNECT to host:port by name through the
// proxy at addr and returns the reply code and the connection.
func socksConnect(t *testing.T, addr, host string, port int) (byte, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	req := append([]byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}, host...)
	req = append(req, byte(port>>8), byte(port))
	c.Write(req)
	var resp [12]byte // method reply (2) + CONNECT reply with an IPv4 address (10)
	if _, err := io.ReadFull(c, resp[:4]); err != nil || resp[0] != 5 || resp[1] != 0 {
		t.Fatalf("SOCKS5 greeting: % x, %v", resp[:4], err)
	}
	code := resp[3]
	if code == 0 {
		io.ReadFull(c, resp[4:]) // atyp IPv4 (4 bytes) + port
	}
	return code, c
}

// TestServerSOCKS: the SOCKS5 listener attributes connections by pod IP
// and applies the same policy.
func TestServerSOCKS(t *testing.T) {
	u := startUpstream(t)
	s := New(Config{Egress: egress.Config{Resolver: testResolver, Logger: slog.New(slog.DiscardHandler)}})
	defer s.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l, egress.SOCKS5)
	addr := l.Addr().String()

	if code, c := socksConnect(t, addr, "allowed.test", u.httpPort); code == 0 {
		c.Close()
		t.Fatal("unknown source connected")
	}
	if err := s.SyncPod(sandboxPod("sb-socks", "uid-socks", allowAllowed), nil); err != nil {
		t.Fatal(err)
	}
	code, c := socksConnect(t, addr, "allowed.test", u.httpPort)
	if code != 0 {
		t.Fatalf("allowed host refused: reply %d", code)
	}
	fmt.Fprintf(c, "GET /socks HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
	b, _ := io.ReadAll(c)
	c.Close()
	if !strings.HasSuffix(string(b), "hello /socks") {
		t.Fatalf("through SOCKS5: %q", b)
	}
	if code, c := socksConnect(t, addr, "other.test", u.httpPort); code != 2 {
		c.Close()
		t.Fatalf("host outside the allowlist: reply %d, want 2 (not allowed)", code)
	}
}
