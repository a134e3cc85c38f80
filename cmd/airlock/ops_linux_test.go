package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/airlock-dev/airlock/internal/pki"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// apiCall sends a JSON request with an optional bearer token and returns
// the status and body.
func apiCall(t *testing.T, c *http.Client, method, u, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// createNative creates a native sandbox through the API and returns its id.
func createNative(t *testing.T, c *http.Client, base, token string, body map[string]any) string {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	body["runtime"] = "native"
	code, b := apiCall(t, c, "POST", base+"/v1/sandboxes", token, body)
	if code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	var info struct{ ID string }
	if err := json.Unmarshal(b, &info); err != nil || info.ID == "" {
		t.Fatalf("create answer %s: %v", b, err)
	}
	return info.ID
}

// TestServeConfigFile: every flag is settable from the TOML file, the
// command line wins over it (the file's unusable --listen is overridden by
// the test server's), and the file's log format applies to every line.
func TestServeConfigFile(t *testing.T) {
	testserver.NeedRoot(t)
	cfg := filepath.Join(t.TempDir(), "airlock.toml")
	if err := os.WriteFile(cfg, []byte(`
# A listen address nobody can bind: the command line's must win.
listen = "192.0.2.1:1"
no-auth = true
default-runtime = "wasm"
default-timeout = "7m"
log-format = "json"
image-registry = ["registry.test:5000", "mirror.test"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := testserver.Start(t, testserver.StateDir(t), "--config", cfg)
	code, b := apiCall(t, http.DefaultClient, "GET", srv.URL+"/v1/info", "", nil)
	if code != 200 {
		t.Fatalf("info: %d %s", code, b)
	}
	var info struct {
		DefaultRuntime string `json:"default_runtime"`
		Auth           bool   `json:"auth"`
	}
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	if info.DefaultRuntime != "wasm" || info.Auth {
		t.Fatalf("info %s: the file's default-runtime and no-auth were not applied", b)
	}
	srv.Stop()
	assertJSONLog(t, srv.ReadLog())
	if !strings.Contains(srv.ReadLog(), `"file":"`+cfg+`"`) {
		t.Errorf("the log does not name the config file read:\n%s", srv.ReadLog())
	}
}

// assertJSONLog checks that every line of log is one JSON object with
// time, level and msg: one format for the whole log.
func assertJSONLog(t *testing.T, log string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("log line is not JSON: %q", sc.Text())
			continue
		}
		if m["time"] == nil || m["level"] == nil || m["msg"] == nil {
			t.Errorf("log line lacks time, level or msg: %q", sc.Text())
		}
		lines = append(lines, m)
	}
	if len(lines) == 0 {
		t.Error("empty log")
	}
	return lines
}

// serveRefused runs airlock serve with args and returns its exit code and
// output; it must exit (a server that starts is killed after 30 s).
func serveRefused(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, airlockBin(t), append([]string{"serve", "--no-auth", "--listen", "127.0.0.1:0",
		"--state-dir", testserver.StateDir(t)}, args...)...).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("serve %v: want a refusal, got %v: %s", args, err, out)
	}
	return ee.ExitCode(), string(out)
}

// TestServeConfigRefusals: an unknown key (a typo), a table and a value a
// flag refuses stop serve before it listens, naming the key; so does half
// a TLS pair, from the command line or from the file.
func TestServeConfigRefusals(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key := writeTLSPair(t, dir, newTestCA(t), "localhost")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown key", []string{"--config", write("typo.toml", "max-sandbox = 5\n")}, `unknown key "max-sandbox"`},
		{"table", []string{"--config", write("table.toml", "[tls]\ncert = \"x\"\n")}, `key "tls"`},
		{"bad value", []string{"--config", write("bad.toml", "default-timeout = \"soon\"\n")}, `key "default-timeout"`},
		{"missing file", []string{"--config", filepath.Join(dir, "none.toml")}, "none.toml"},
		{"cert without key", []string{"--tls-cert", cert}, "--tls-cert needs --tls-key"},
		{"key without cert", []string{"--tls-key", key}, "--tls-key needs --tls-cert"},
		{"half TLS in the file", []string{"--config", write("half.toml", fmt.Sprintf("tls-cert = %q\n", cert))}, "--tls-cert needs --tls-key"},
		{"key of another cert", []string{"--tls-cert", cert, "--tls-key", write("other.key", string(otherKeyPEM(t)))}, "private key does not match"},
		{"bad log format", []string{"--log-format", "xml"}, `--log-format "xml"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out := serveRefused(t, c.args...)
			if code != exitUsage || !strings.Contains(out, c.want) || strings.Contains(out, "listening on") {
				t.Fatalf("exit %d, output %q: want exit %d naming %q, never listening", code, out, exitUsage, c.want)
			}
		})
	}
}

// testCA is a certificate authority of the test's own.
type testCA struct {
	*pki.Authority
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	a, err := pki.NewAuthority("airlock ops test CA", time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(a.Cert)
	return &testCA{Authority: a, pool: pool}
}

// writeTLSPair issues a server certificate for names (DNS names, IP
// literals) and writes it and its key as cert.pem and key.pem in dir.
func writeTLSPair(t *testing.T, dir string, ca *testCA, names ...string) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.KeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, kf := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	// Written to new files renamed into place, as certbot and
	// cert-manager do, so a reload never reads half a file.
	for _, f := range []struct {
		path string
		data []byte
	}{{cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, {kf, keyPEM}} {
		if err := os.WriteFile(f.path+".new", f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f.path+".new", f.path); err != nil {
			t.Fatal(err)
		}
	}
	return cert, kf
}

func otherKeyPEM(t *testing.T) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.KeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tlsClient trusts only ca and dials addr whatever the URL's host, so
// that a request for https://49983-ID.e2b.test/ sends that name in SNI
// and Host, as a client resolving *.e2b.test to this server would.
func tlsClient(ca *x509.CertPool, addr string) *http.Client {
	d := net.Dialer{Timeout: 30 * time.Second}
	return &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		}}}
}

// servedSerial is the serial number of the certificate the server at addr
// presents for name.
func servedSerial(t *testing.T, addr, name string, ca *x509.CertPool) (*big.Int, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr, &tls.Config{ServerName: name, RootCAs: ca})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// TestServeTLS: with --tls-cert/--tls-key the API is HTTPS only (a client
// that trusts the CA gets answers, one that does not and a plain HTTP
// client get none); E2B's host routing (--e2b-domain) works over TLS
// with the sandbox's name in SNI; SIGHUP swaps in a renewed certificate
// without a restart and a broken one is refused, the old one kept.
func TestServeTLS(t *testing.T) {
	testserver.NeedRoot(t)
	dir := t.TempDir()
	ca := newTestCA(t)
	cert, key := writeTLSPair(t, dir, ca, "localhost", "127.0.0.1", "*.e2b.test")
	state := testserver.StateDir(t)
	token := testserver.NewKey(t, state, "tls")
	srv := testserver.Start(t, state, "--tls-cert", cert, "--tls-key", key, "--e2b-domain", "e2b.test")
	if !strings.HasPrefix(srv.URL, "https://") {
		t.Fatalf("server URL %s: want https", srv.URL)
	}
	addr := strings.TrimPrefix(srv.URL, "https://")
	c := tlsClient(ca.pool, addr)

	if code, b := apiCall(t, c, "GET", srv.URL+"/v1/info", token, nil); code != 200 {
		t.Fatalf("info over TLS: %d %s", code, b)
	}
	// A client that does not trust the CA fails the handshake.
	if _, err := http.Get(srv.URL + "/healthz"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted client: %v, want a certificate error", err)
	}
	// Plain HTTP on the TLS port gets no API answer.
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatalf("plain HTTP on the TLS listener answered 200: %s", b)
		}
	}

	// E2B: create through its control plane, then reach the sandbox's envd
	// by host name over TLS.
	req, _ := http.NewRequest("POST", srv.URL+"/sandboxes", strings.NewReader(`{"templateID":"base","timeout":120}`))
	req.Header.Set("X-API-Key", token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if resp.StatusCode != 201 || json.Unmarshal(b, &sb) != nil || sb.SandboxID == "" {
		t.Fatalf("E2B create over TLS: %d %s", resp.StatusCode, b)
	}
	host := fmt.Sprintf("49983-%s.e2b.test", sb.SandboxID)
	req, _ = http.NewRequest("GET", "https://"+host+"/health", nil)
	req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
	resp, err = c.Do(req)
	if err != nil {
		t.Fatalf("envd by host name over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("envd /health at %s: %d, want 204 (host routing over TLS)", host, resp.StatusCode)
	}
	// Without its token the same host is refused by envd's check: the
	// request did reach the sandbox's route, not the API's 404.
	resp, err = c.Get("https://" + host + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), sb.SandboxID) {
		t.Fatalf("envd without token: %d %s", resp.StatusCode, b)
	}

	// SIGHUP: a renewed certificate is served from the next handshake.
	old, err := servedSerial(t, addr, "localhost", ca.pool)
	if err != nil {
		t.Fatal(err)
	}
	writeTLSPair(t, dir, ca, "localhost", "127.0.0.1", "*.e2b.test")
	renewed := waitServed(t, srv, addr, ca.pool, func(s *big.Int) bool { return s.Cmp(old) != 0 })
	// A broken pair (a key that is not the certificate's) is refused and
	// the renewed certificate stays.
	if err := os.WriteFile(key, otherKeyPEM(t), 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(srv.Pid(), syscall.SIGHUP)
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(srv.ReadLog(), "TLS certificate reload failed"); {
		if time.Now().After(deadline) {
			t.Fatalf("no reload failure logged:\n%s", srv.ReadLog())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s, err := servedSerial(t, addr, "localhost", ca.pool); err != nil || s.Cmp(renewed) != 0 {
		t.Fatalf("after a broken reload: serial %v err %v, want the renewed %v still served", s, err, renewed)
	}
	if code, b := apiCall(t, c, "GET", srv.URL+"/v1/info", token, nil); code != 200 {
		t.Fatalf("info after a broken reload: %d %s", code, b)
	}
}

// waitServed sends SIGHUP and polls the served certificate until its
// serial passes ok (each poll sends SIGHUP again: reloading an unchanged
// pair is harmless, and the test never depends on one signal's timing).
func waitServed(t *testing.T, srv *testserver.Server, addr string, ca *x509.CertPool, ok func(*big.Int) bool) *big.Int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		syscall.Kill(srv.Pid(), syscall.SIGHUP)
		s, err := servedSerial(t, addr, "localhost", ca)
		if err == nil && ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("renewed certificate never served (last %v, %v):\n%s", s, err, srv.ReadLog())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestServeRequestLogNoSecrets: every API call gets one JSON log line
// with method, route pattern, status, duration, key id and sandbox id;
// no line carries an API key (valid or not), an egress secret's value or
// a token put in a query string or path.
func TestServeRequestLogNoSecrets(t *testing.T) {
	testserver.NeedRoot(t)
	state := testserver.StateDir(t)
	token := testserver.NewKey(t, state, "logs")
	srv := testserver.Start(t, state, "--log-format", "json", "--log-level", "debug")
	c := &http.Client{Timeout: 2 * time.Minute}
	const secretValue = "Bearer sk-live-SECRET-egress-0123456789"
	const queryToken = "al_QUERYtokenQUERYtokenQUERYtokenQUERYtoken01"
	const wrongKey = "al_WRONGkeyWRONGkeyWRONGkeyWRONGkeyWRONGkey0"

	id := createNative(t, c, srv.URL, token, map[string]any{
		"network": map[string]any{"mode": "allowlist", "allow": []string{"api.test"}},
		"secrets": []map[string]string{{"host": "api.test", "header": "Authorization", "value": secretValue}}})
	if code, b := apiCall(t, c, "POST", srv.URL+"/v1/sandboxes/"+id+"/exec", token, map[string]any{"argv": []string{"true"}}); code != 200 {
		t.Fatalf("exec: %d %s", code, b)
	}
	// Tokens where they do not belong: a query string, a path, a wrong key.
	apiCall(t, c, "GET", srv.URL+"/v1/sandboxes?token="+queryToken, token, nil)
	apiCall(t, c, "GET", srv.URL+"/v1/sandboxes/"+queryToken+"/files?path=/x&access_token="+queryToken, token, nil)
	apiCall(t, c, "GET", srv.URL+"/"+queryToken, token, nil)
	if code, _ := apiCall(t, c, "GET", srv.URL+"/v1/sandboxes", wrongKey, nil); code != 401 {
		t.Fatalf("wrong key: %d, want 401", code)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes?token="+queryToken, nil)
	req.Header.Set("X-API-Key", token)
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
	}
	apiCall(t, c, "GET", srv.URL+"/healthz", "", nil)
	apiCall(t, c, "DELETE", srv.URL+"/v1/sandboxes/"+id, token, nil)
	srv.Stop()

	log := srv.ReadLog()
	lines := assertJSONLog(t, log)
	for _, s := range []string{token, strings.TrimPrefix(token, "al_"), secretValue, "sk-live-SECRET", queryToken, wrongKey, "access_token"} {
		if strings.Contains(log, s) {
			t.Errorf("the server log contains %q", s)
		}
	}
	want := map[string]bool{}
	for _, m := range lines {
		if m["msg"] != "request" {
			continue
		}
		for _, f := range []string{"method", "route", "status", "duration_ms"} {
			if m[f] == nil {
				t.Errorf("request line without %s: %v", f, m)
			}
		}
		route, _ := m["route"].(string)
		if strings.Contains(route, id) || strings.Contains(route, "?") {
			t.Errorf("route %q is a raw path, not a pattern", route)
		}
		key := fmt.Sprint(m["key_id"])
		switch {
		case route == "POST /v1/sandboxes" && m["status"] == 201.0 && m["sandbox_id"] == id && key != "<nil>":
			want["create"] = true
		case route == "POST /v1/sandboxes/{id}/exec" && m["status"] == 200.0 && m["sandbox_id"] == id && key != "<nil>":
			want["exec"] = true
		case route == "GET /v1/sandboxes" && m["status"] == 401.0 && m["key_id"] == nil:
			want["unauthorized"] = true
		case route == "unmatched" && m["status"] == 404.0:
			want["unmatched"] = true
		case route == "e2b GET /sandboxes":
			want["e2b"] = true
		case route == "GET /healthz" && m["level"] == "DEBUG":
			want["healthz"] = true
		case route == "DELETE /v1/sandboxes/{id}" && m["sandbox_id"] == id:
			want["kill"] = true
		}
	}
	for _, w := range []string{"create", "exec", "unauthorized", "unmatched", "e2b", "healthz", "kill"} {
		if !want[w] {
			t.Errorf("no request line for %s in:\n%s", w, log)
		}
	}
}

// scrape reads /metrics with Prometheus' own text parser.
func scrape(t *testing.T, c *http.Client, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// histCount is the sample count of family name's histogram with labels.
func histCount(fams map[string]*dto.MetricFamily, name string, labels map[string]string) uint64 {
	f := fams[name]
	if f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
		return 0
	}
	var n uint64
next:
	for _, m := range f.Metric {
		for _, l := range m.Label {
			if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
				continue next
			}
		}
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

// TestServeMetrics: real creates, execs, a code cell, pause and resume,
// and refused egress show up in /metrics as histograms labelled by
// runtime and status, parsed by Prometheus' text parser; the series of
// earlier versions keep their names; no label holds a raw path.
func TestServeMetrics(t *testing.T) {
	testserver.NeedRoot(t)
	srv := testserver.Start(t, testserver.StateDir(t), "--no-auth")
	c := &http.Client{Timeout: 3 * time.Minute}
	id := createNative(t, c, srv.URL, "", map[string]any{"network": map[string]any{"mode": "allowlist", "allow": []string{"api.test"}}})
	if code, b := apiCall(t, c, "POST", srv.URL+"/v1/sandboxes/"+id+"/exec", "", map[string]any{
		"shell": "curl -sS -m 20 http://denied.test/ || true"}); code != 200 {
		t.Fatalf("exec: %d %s", code, b)
	}
	if code, b := apiCall(t, c, "POST", srv.URL+"/v1/sandboxes/"+id+"/code", "", map[string]any{"code": "print(6*7)"}); code != 200 {
		t.Fatalf("code: %d %s", code, b)
	}
	for _, op := range []string{"pause", "resume"} {
		if code, b := apiCall(t, c, "POST", srv.URL+"/v1/sandboxes/"+id+"/"+op, "", nil); code != 200 {
			t.Fatalf("%s: %d %s", op, code, b)
		}
	}
	// An E2B create is timed too.
	req, _ := http.NewRequest("POST", srv.URL+"/sandboxes", strings.NewReader(`{"templateID":"base","timeout":60}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("E2B create: %d %s", resp.StatusCode, b)
	}
	// A create that fails, and an exec in a sandbox that does not exist.
	if code, _ := apiCall(t, c, "POST", srv.URL+"/v1/sandboxes", "", map[string]any{"runtime": "native", "profile": "no-such-profile"}); code < 400 {
		t.Fatalf("create with an unknown profile: %d", code)
	}
	apiCall(t, c, "POST", srv.URL+"/v1/sandboxes/sb-none/exec", "", map[string]any{"argv": []string{"true"}})

	// The egress record is written when the refused connection ends:
	// poll for it.
	var fams map[string]*dto.MetricFamily
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		fams = scrape(t, c, srv.URL)
		if histCount(fams, "airlock_egress_connection_duration_seconds", map[string]string{"runtime": "native", "status": "denied"}) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no denied egress connection in /metrics")
		}
	}
	if n := histCount(fams, "airlock_sandbox_create_duration_seconds", map[string]string{"runtime": "native", "status": "ok"}); n < 2 {
		t.Errorf("%d successful native creates timed, want 2 (API and E2B)", n)
	}
	for _, h := range []struct {
		name   string
		labels map[string]string
	}{
		{"airlock_exec_duration_seconds", map[string]string{"runtime": "native", "status": "ok"}},
		{"airlock_exec_duration_seconds", map[string]string{"runtime": "unknown", "status": "not_found"}},
		{"airlock_cell_duration_seconds", map[string]string{"runtime": "native", "status": "ok"}},
		{"airlock_sandbox_pause_duration_seconds", map[string]string{"runtime": "native", "status": "ok"}},
		{"airlock_sandbox_resume_duration_seconds", map[string]string{"runtime": "native", "status": "ok"}},
		{"airlock_http_request_duration_seconds", map[string]string{"route": "POST /v1/sandboxes/{id}/exec", "code": "200", "method": "POST"}},
	} {
		if histCount(fams, h.name, h.labels) == 0 {
			t.Errorf("%s%v: no sample", h.name, h.labels)
		}
	}
	failed := uint64(0)
	for _, m := range fams["airlock_sandbox_create_duration_seconds"].GetMetric() {
		for _, l := range m.Label {
			if l.GetName() == "status" && l.GetValue() != "ok" {
				failed += m.GetHistogram().GetSampleCount()
			}
		}
	}
	if failed == 0 {
		t.Error("the failed create has no sample with a non-ok status")
	}
	for _, name := range []string{"airlock_sandboxes_running", "airlock_pool_idle", "airlock_sandboxes_created_total", "airlock_sandboxes_killed_total",
		"airlock_sandboxes_expired_total", "airlock_sandboxes_lost_total", "airlock_sandboxes_reattached_total", "airlock_sandbox_create_errors_total",
		"airlock_execs_total", "airlock_sandbox_oom_kills_total", "airlock_sandbox_pids_limit_hits_total", "airlock_egress_denied_total",
		"airlock_http_requests_total", "airlock_http_errors_total"} {
		if fams[name] == nil || len(fams[name].Metric) == 0 {
			t.Errorf("series %s of earlier versions is gone", name)
		}
	}
	if v := fams["airlock_sandboxes_created_total"].GetMetric()[0].GetCounter().GetValue(); v < 1 {
		t.Errorf("airlock_sandboxes_created_total = %v", v)
	}
	if v := fams["airlock_egress_denied_total"].GetMetric()[0].GetCounter().GetValue(); v < 1 {
		t.Errorf("airlock_egress_denied_total = %v", v)
	}
	for name, f := range fams {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if strings.Contains(l.GetValue(), id) || strings.Contains(l.GetValue(), "sb-none") {
					t.Errorf("%s has label %s=%q: a raw path or id, unbounded", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
	// The default log format, text: every line is one slog record.
	srv.Stop()
	for _, l := range strings.Split(strings.TrimSpace(srv.ReadLog()), "\n") {
		if !strings.HasPrefix(l, "time=") || !strings.Contains(l, " level=") || !strings.Contains(l, " msg=") {
			t.Errorf("log line not in slog's text format: %q", l)
		}
	}
}
