package egress

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// testSecret is the credential the tests inject. The sandbox side must
// never see it.
const testSecret = "Bearer sk-test-4f7c2d9e1a6b8c3f"

// The static resolver maps these names to 127.0.0.1; nothing leaves the
// machine.
var testResolver = StaticResolver{
	"allowed.test": {net.IPv4(127, 0, 0, 1)},
	"denied.test":  {net.IPv4(127, 0, 0, 1)},
	"secure.test":  {net.IPv4(127, 0, 0, 1)},
	"plain.test":   {net.IPv4(127, 0, 0, 1)},
	"echo.test":    {net.IPv4(127, 0, 0, 1)},
	"mixed.test":   {net.IPv4(127, 0, 0, 1), net.ParseIP("10.0.0.1")},
	"v6.test":      {net.ParseIP("::1")},
}

// testCA is a certificate authority for the upstream HTTPS test server,
// unrelated to the sandbox CAs the proxy makes.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	pem  []byte
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "upstream test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) leaf(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// upstreams are the local servers the tests reach through the proxy.
type upstreams struct {
	ca        *testCA
	http      *httptest.Server // plain HTTP
	https     *httptest.Server // HTTPS with a certificate for secure.test from ca
	httpPort  int
	httpsPort int
	echoPort  int
	echo6Port int // 0 without IPv6 loopback

	mu       sync.Mutex
	authSeen []string // Authorization headers the servers received
	remotes  map[string]int
}

func (u *upstreams) sawAuth() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.authSeen...)
}

// handler answers /hello, echoes request headers on /echo (as a hostile
// upstream might), and on /upgrade switches to an echo protocol.
func (u *upstreams) handler(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.authSeen = append(u.authSeen, r.Header.Get("Authorization"))
	u.remotes[r.RemoteAddr]++
	u.mu.Unlock()
	switch r.URL.Path {
	case "/echo":
		w.Header().Set("X-Echo-Authorization", r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "host=%s\n", r.Host)
		r.Header.Write(w)
	case "/auth":
		if r.Header.Get("Authorization") != testSecret {
			http.Error(w, "missing credential", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "authorized\n")
	case "/upgrade":
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want Upgrade: echo", http.StatusBadRequest)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		io.Copy(c, brw)
	default:
		fmt.Fprintf(w, "hello from %s %s\n", r.Host, r.URL.Path)
	}
}

func startUpstreams(t testing.TB) *upstreams {
	t.Helper()
	u := &upstreams{ca: newTestCA(t), remotes: map[string]int{}}
	u.http = httptest.NewServer(http.HandlerFunc(u.handler))
	t.Cleanup(u.http.Close)
	u.https = httptest.NewUnstartedServer(http.HandlerFunc(u.handler))
	u.https.TLS = &tls.Config{Certificates: []tls.Certificate{u.ca.leaf(t, "secure.test", "plain.test")}}
	u.https.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes the tests break on purpose
	u.https.StartTLS()
	t.Cleanup(u.https.Close)
	u.httpPort = portOf(t, u.http.Listener.Addr())
	u.httpsPort = portOf(t, u.https.Listener.Addr())
	u.echoPort = startEcho(t, "127.0.0.1:0")
	if l, err := net.Listen("tcp", "[::1]:0"); err == nil {
		l.Close()
		u.echo6Port = startEcho(t, "[::1]:0")
	}
	return u
}

func startEcho(t testing.TB, addr string) int {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return portOf(t, l.Addr())
}

func portOf(t testing.TB, a net.Addr) int {
	t.Helper()
	return a.(*net.TCPAddr).Port
}

// recorder collects Records.
type recorder struct {
	mu   sync.Mutex
	recs []Record
	ch   chan Record
}

func newRecorder() *recorder { return &recorder{ch: make(chan Record, 1000)} }

func (r *recorder) add(rec Record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
	r.ch <- rec
}

// next waits for the next record. The timeout only keeps a broken test
// from hanging; no test depends on how long anything takes.
func (r *recorder) next(t testing.TB) Record {
	t.Helper()
	select {
	case rec := <-r.ch:
		return rec
	case <-time.After(20 * time.Second):
		t.Fatal("no connection record arrived")
		return Record{}
	}
}

// testProxy is a proxy with one sandbox, listening on 127.0.0.1 for both
// protocols.
type testProxy struct {
	p         *Proxy
	rec       *recorder
	id        string
	httpAddr  string
	socksAddr string
}

func startProxy(t testing.TB, u *upstreams, sb Sandbox, mod ...func(*Config)) *testProxy {
	t.Helper()
	rec := newRecorder()
	cfg := Config{
		Resolver:     testResolver,
		OnConnection: rec.add,
		Logger:       slog.New(slog.DiscardHandler),
	}
	if u != nil {
		cfg.RootCAs = u.ca.pool
	}
	for _, m := range mod {
		m(&cfg)
	}
	p := New(cfg)
	t.Cleanup(func() { p.Close() })
	id := "sb-" + strings.ReplaceAll(t.Name(), "/", "-")
	if err := p.AddSandbox(id, sb); err != nil {
		t.Fatal(err)
	}
	hl, err := p.Listen("127.0.0.1:0", id, HTTP)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := p.Listen("127.0.0.1:0", id, SOCKS5)
	if err != nil {
		t.Fatal(err)
	}
	return &testProxy{p: p, rec: rec, id: id, httpAddr: hl.Addr().String(), socksAddr: sl.Addr().String()}
}

// client is a net/http client that uses the proxy and trusts roots.
func (tp *testProxy) client(t testing.TB, roots *x509.CertPool) (*http.Client, *http.Transport) {
	t.Helper()
	u, _ := url.Parse("http://" + tp.httpAddr)
	tr := &http.Transport{
		Proxy:           http.ProxyURL(u),
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, tr
}

// get fetches url through the proxy and returns the status, body and
// headers; it closes the transport's connections so the records are final.
func (tp *testProxy) get(t testing.TB, roots *x509.CertPool, rawURL string, hdr ...string) (int, string, http.Header) {
	t.Helper()
	c, tr := tp.client(t, roots)
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest("GET", rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", rawURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", rawURL, err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// connectRaw sends CONNECT target over a fresh connection and returns the
// response and the connection.
func (tp *testProxy) connectRaw(t testing.TB, target string) (*http.Response, string, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", tp.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	var body string
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
	}
	return resp, body, c, br
}

// socksDial is a minimal SOCKS5 client: no authentication, CONNECT to
// host:port with the given address type (3 = name, 1 = IPv4, 4 = IPv6). It
// returns the reply code and, on success, the tunnel.
func socksDial(t testing.TB, proxyAddr string, atyp byte, host string, port int) (byte, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	code, err := socksHandshake(c, atyp, host, port)
	if err != nil {
		c.Close()
		t.Fatalf("SOCKS5 to %s: %v", host, err)
	}
	if code != 0 {
		c.Close()
		return code, nil
	}
	t.Cleanup(func() { c.Close() })
	return code, c
}

func socksHandshake(c net.Conn, atyp byte, host string, port int) (byte, error) {
	if _, err := c.Write([]byte{5, 1, 0}); err != nil {
		return 0, err
	}
	var sel [2]byte
	if _, err := io.ReadFull(c, sel[:]); err != nil {
		return 0, fmt.Errorf("method selection: %w", err)
	}
	if sel != [2]byte{5, 0} {
		return 0, fmt.Errorf("method selection %v", sel)
	}
	req := []byte{5, 1, 0, atyp}
	switch atyp {
	case 1:
		req = append(req, net.ParseIP(host).To4()...)
	case 4:
		req = append(req, net.ParseIP(host).To16()...)
	case 3:
		req = append(req, byte(len(host)))
		req = append(req, host...)
	}
	req = binary.BigEndian.AppendUint16(req, uint16(port))
	if _, err := c.Write(req); err != nil {
		return 0, err
	}
	var rep [10]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil {
		return 0, fmt.Errorf("reply: %w", err)
	}
	if rep[0] != 5 || rep[3] != 1 {
		return 0, fmt.Errorf("malformed reply %v", rep)
	}
	return rep[1], nil
}

// roundTrip writes msg and reads back as many bytes.
func roundTrip(t testing.TB, c net.Conn, msg string) string {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	b := make([]byte, len(msg))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// wantNoSecret fails if s contains the secret or its token.
func wantNoSecret(t testing.TB, where, s string) {
	t.Helper()
	token := testSecret[strings.LastIndexByte(testSecret, ' ')+1:]
	if strings.Contains(s, token) {
		t.Errorf("%s contains the secret: %q", where, s)
	}
}
