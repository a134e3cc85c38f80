package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/store"
)

// testSecret is the credential the tests inject. It is long and unusual
// enough that finding it anywhere means it leaked.
const testSecret = "Bearer sk-airlock-test-7f3c9e1a5b2d4f60"

// Test names, all resolved by the server (--resolve) to 127.0.0.1: no
// traffic leaves the machine.
var testNames = []string{"web.test", "tls.test", "secret.test", "other.test",
	"api.corp.test", "blocked.corp.test", "echo.corp.test"}

// netEnv is the set of local servers the network tests reach through the
// proxy, and a server configured to reach them.
type netEnv struct {
	// caPEM is the test CA that signed the HTTPS server's certificate;
	// caFile holds it on the host (--upstream-ca).
	caPEM  []byte
	caFile string

	httpPort, httpsPort, echoPort, udpPort int

	// What the HTTPS server saw on /secret requests.
	mu        sync.Mutex
	snis      []string
	auths     []string
	httpHits  atomic.Int64
	echoConns atomic.Int64
	udpPkts   atomic.Int64

	state string
	srv   *srv
	c     *client.Client
	key   string
}

// startNetEnv starts an HTTP server, an HTTPS server with a fresh test CA,
// a TCP echo server and a UDP sink on 127.0.0.1, and airlock serve with
// --resolve for every test name and --upstream-ca for the test CA.
func startNetEnv(t testing.TB, extra ...string) *netEnv {
	t.Helper()
	e := startLocalServers(t)
	e.key = newKey(t, e.state, "net")
	e.srv = startServer(t, e.state, append(e.serveArgs(), extra...)...)
	e.c = client.New(e.srv.URL, e.key)
	return e
}

// serveArgs are the airlock serve (or run) flags that map the test names
// to 127.0.0.1 and trust the test CA upstream.
func (e *netEnv) serveArgs() []string {
	args := []string{"--upstream-ca", e.caFile}
	for _, n := range testNames {
		args = append(args, "--resolve", n+"=127.0.0.1")
	}
	return args
}

// startLocalServers starts the local servers only.
func startLocalServers(t testing.TB) *netEnv {
	t.Helper()
	needRoot(t)
	state := stateDir(t)
	e := &netEnv{state: state}

	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "airlock network test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	e.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	e.caFile = filepath.Join(state, "test-ca.pem")
	if err := os.WriteFile(e.caFile, e.caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "tls.test"},
		DNSNames: []string{"tls.test", "secret.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf := tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}

	// HTTP: names the host it was asked for.
	hl := listenLocal(t)
	e.httpPort = hl.Addr().(*net.TCPAddr).Port
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.httpHits.Add(1)
		if r.URL.Path == "/big" {
			w.Write(make([]byte, 64<<10))
			return
		}
		if r.URL.Path == "/stream" { // ?mb=N: N MiB of zeros
			n, _ := strconv.Atoi(r.URL.Query().Get("mb"))
			w.Header().Set("Content-Length", strconv.Itoa(n<<20))
			chunk := make([]byte, 64<<10)
			for i := 0; i < n*16; i++ {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
			return
		}
		fmt.Fprintf(w, "http-ok host=%s\n", r.Host)
	})}
	go hs.Serve(hl)
	t.Cleanup(func() { hs.Close() })

	// HTTPS: /secret checks the injected header; it records the SNI and
	// the header it got, and never echoes the header back.
	tl := listenLocal(t)
	e.httpsPort = tl.Addr().(*net.TCPAddr).Port
	tcfg := &tls.Config{Certificates: []tls.Certificate{leaf}, NextProtos: []string{"http/1.1"}}
	// Clients that reject the certificate (on purpose) end handshakes
	// abruptly: keep those errors out of the test output.
	ts := &http.Server{ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sni := ""
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		if r.URL.Path == "/secret" {
			e.mu.Lock()
			e.snis = append(e.snis, sni)
			e.auths = append(e.auths, r.Header.Get("Authorization"))
			e.mu.Unlock()
			if r.Header.Get("Authorization") != testSecret {
				http.Error(w, "auth-missing", http.StatusUnauthorized)
				return
			}
			fmt.Fprintf(w, "auth-ok sni=%s\n", sni)
			return
		}
		fmt.Fprintf(w, "https-ok sni=%s\n", sni)
	})}
	go ts.Serve(tls.NewListener(tl, tcfg))
	t.Cleanup(func() { ts.Close() })

	// TCP echo.
	el := listenLocal(t)
	e.echoPort = el.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := el.Accept()
			if err != nil {
				return
			}
			e.echoConns.Add(1)
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { el.Close() })

	// UDP sink: a DNS server would have to be here.
	uc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.udpPort = uc.LocalAddr().(*net.UDPAddr).Port
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := uc.ReadFrom(buf); err != nil {
				return
			}
			e.udpPkts.Add(1)
		}
	}()
	t.Cleanup(func() { uc.Close() })

	return e
}

func listenLocal(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// seen returns what the HTTPS server recorded on /secret.
func (e *netEnv) seen() (snis, auths []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.snis...), append([]string(nil), e.auths...)
}

// create creates a sandbox with a network policy and secrets, and puts
// the test CA at /workspace/ca.pem.
func (e *netEnv) create(t testing.TB, n *client.Network, secrets ...client.Secret) *client.Sandbox {
	t.Helper()
	ctx := ctxT(t)
	sb, err := e.c.Create(ctx, client.CreateRequest{Timeout: 600, Network: n, Secrets: secrets})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Kill(context.Background(), sb.ID) })
	if _, err := e.c.WriteFile(ctx, sb.ID, "/workspace/ca.pem", strings.NewReader(string(e.caPEM)), 0o644); err != nil {
		t.Fatal(err)
	}
	return sb
}

// sh runs a shell command in a sandbox.
func (e *netEnv) sh(t testing.TB, id, cmd string) *client.ExecResult {
	t.Helper()
	res, err := e.c.Exec(ctxT(t), id, client.ExecRequest{Shell: cmd, Timeout: 60, MaxOutput: 16 << 20})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return res
}

// py runs a Python program in a sandbox.
func (e *netEnv) py(t testing.TB, id, prog string) *client.ExecResult {
	t.Helper()
	res, err := e.c.Exec(ctxT(t), id, client.ExecRequest{Argv: []string{"python3", "-c", prog}, Timeout: 60})
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	return res
}

// want checks that out (stdout of a command) contains every string.
func want(t testing.TB, what string, res *client.ExecResult, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(res.Stdout, s) {
			t.Errorf("%s: stdout lacks %q\nstdout: %s\nstderr: %s", what, s, res.Stdout, res.Stderr)
		}
	}
}

// url is a URL on one of the test servers under a test name.
func (e *netEnv) url(scheme, name, path string) string {
	port := e.httpPort
	if scheme == "https" {
		port = e.httpsPort
	}
	return scheme + "://" + name + ":" + strconv.Itoa(port) + path
}

// waitLog polls the sandbox's network log until match holds for it.
func (e *netEnv) waitLog(t testing.TB, id, what string, match func([]client.Connection) bool) []client.Connection {
	t.Helper()
	var log []client.Connection
	eventually(t, 30*time.Second, what, func() bool {
		var err error
		log, err = e.c.NetworkLog(ctxT(t), id, 0)
		if err != nil {
			t.Fatal(err)
		}
		return match(log)
	})
	return log
}

// hasConn reports whether log has an entry for host (and port, if not 0)
// with the verdict allowed whose reason contains reason.
func hasConn(log []client.Connection, host string, port int, allowed bool, reason string) bool {
	for _, c := range log {
		if c.Host == host && (port == 0 || c.Port == port) && c.Allowed == allowed && strings.Contains(c.Reason, reason) {
			return true
		}
	}
	return false
}

// auditOf returns the audit events of a sandbox from the server's store.
func auditOf(t testing.TB, state, id string) []store.AuditEvent {
	t.Helper()
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs, err := st.AuditLog(context.Background(), store.AuditFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// storedRecord returns a sandbox's record as stored.
func storedRecord(t testing.TB, state, id string) *store.Sandbox {
	t.Helper()
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// storedNetwork decodes the network section of a stored policy.
func storedNetwork(t testing.TB, rec *store.Sandbox) client.Network {
	t.Helper()
	var p struct {
		Network client.Network `json:"network"`
	}
	if err := json.Unmarshal(rec.Policy, &p); err != nil {
		t.Fatal(err)
	}
	return p.Network
}

// socksScript connects through the SOCKS5 proxy at 127.0.0.1:1080 to
// host:port by name, sends a line and prints the reply (or the SOCKS reply
// code when the proxy refuses).
const socksScript = `
import socket, struct, sys
host, port, msg = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
s = socket.create_connection(("127.0.0.1", 1080), timeout=20)
s.sendall(b"\x05\x01\x00")
assert s.recv(2) == b"\x05\x00"
h = host.encode()
s.sendall(b"\x05\x01\x00\x03" + bytes([len(h)]) + h + struct.pack(">H", port))
rep = s.recv(10)
if rep[1] != 0:
    print("socks-reply", rep[1]); sys.exit(0)
s.sendall(msg)
print("echo:", s.recv(100).decode())
`
