package e2b

import (
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSignedFileURLByHost: with a domain, a signed /files URL is complete
// (the host names the sandbox and port), so a request with no header at
// all reads and writes the file it names; a URL signed for another
// operation, path or user, a tampered or an expired one is a 401. The
// signature is computed here from the SDKs' formula, independently of
// signature.go (tests/js/e2b-scenario.mjs checks the SDKs' own URLs).
func TestSignedFileURLByHost(t *testing.T) {
	e := newEnvConfig(t, true, Config{Domain: "sandboxes.test"})
	var c sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base"}`).json(t, &c)
	defer e.api(t, "DELETE", "/sandboxes/"+c.SandboxID, e.key, "")
	host := "49983-" + c.SandboxID + ".sandboxes.test"

	sign := func(path, op, user string, exp int64) string {
		raw := path + ":" + op + ":" + user + ":" + c.EnvdAccessToken
		q := url.Values{"path": {path}}
		if user != "" {
			q.Set("username", user)
		}
		if exp != 0 {
			raw += ":" + strconv.FormatInt(exp, 10)
			q.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		sum := sha256.Sum256([]byte(raw))
		q.Set("signature", "v1_"+base64.StdEncoding.EncodeToString(sum[:])[:43])
		return "/files?" + q.Encode()
	}
	send := func(method, target, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, e.url+target, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host // what DNS for *.DOMAIN gives; no other header
		if method == "POST" {
			req.Header.Set("Content-Type", "application/octet-stream")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const p = "/home/user/signed.txt"
	later := time.Now().Add(time.Minute).Unix()
	if st, b := send("POST", sign(p, "write", "", later), "signed bytes"); st != 200 {
		t.Fatalf("signed upload: %d %s", st, b)
	}
	if st, b := send("GET", sign(p, "read", "", 0), ""); st != 200 || b != "signed bytes" {
		t.Fatalf("signed download: %d %q", st, b)
	}
	if st, b := send("GET", sign(p, "read", "user", later), ""); st != 200 || b != "signed bytes" {
		t.Fatalf("signed download as user, expiring: %d %q", st, b)
	}
	refused := []struct{ what, method, target, want string }{
		{"read URL used to write", "POST", sign(p, "read", "", 0), "invalid signature"},
		{"write URL used to read", "GET", sign(p, "write", "", 0), "invalid signature"},
		{"another path", "GET", strings.Replace(sign(p, "read", "", 0), "signed.txt", "other.txt", 1), "invalid signature"},
		{"another user", "GET", strings.Replace(sign(p, "read", "user", 0), "username=user", "username=root", 1), "invalid signature"},
		{"expiration moved", "GET", strings.Replace(sign(p, "read", "", later), strconv.FormatInt(later, 10), strconv.FormatInt(later+3600, 10), 1), "invalid signature"},
		{"expired", "GET", sign(p, "read", "", time.Now().Add(-time.Minute).Unix()), "signature is already expired"},
		{"expired and tampered (the signature is checked first, as by envd)", "GET", strings.Replace(sign(p, "read", "", time.Now().Add(-time.Minute).Unix()), "signature=v1_", "signature=v1_A", 1), "invalid signature"},
		{"tampered", "GET", strings.Replace(sign(p, "read", "", 0), "signature=v1_", "signature=v1_A", 1), "invalid signature"},
		{"no signature, no token", "GET", "/files?path=" + url.QueryEscape(p), "X-Access-Token"},
		{"signed upload without a path", "POST", strings.Replace(sign("", "write", "", 0), "path=&", "", 1), "path parameter"},
	}
	for _, r := range refused {
		if st, b := send(r.method, r.target, "x"); st != 401 || !strings.Contains(b, r.want) {
			t.Errorf("%s: %d %s, want 401 naming %q", r.what, st, b, r.want)
		}
	}
	// E2B's own suite compares the whole body of an expired URL's refusal
	// with envd's (tests/sandbox/files/signing.test.ts).
	expired := sign(p, "read", "", time.Now().Add(-time.Minute).Unix())
	if st, b := send("GET", expired, ""); st != 401 || strings.TrimSpace(b) != `{"code":401,"message":"signature is already expired"}` {
		t.Errorf("expired URL: %d %s, want envd's body exactly", st, b)
	}
	if st, b := send("GET", sign(p, "read", "", 0), ""); st != 200 || b != "signed bytes" {
		t.Fatalf("file changed by a refused request: %d %q", st, b)
	}
}
