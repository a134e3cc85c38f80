package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock-dev/airlock/client"
)

// dashReq sends a request to the server as a browser would: the session
// cookie, and optionally the CSRF header, an Origin and Sec-Fetch-Site.
func dashReq(t *testing.T, method, url, cookie, csrf, origin, body string) (int, string, *http.Response) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if cookie != "" {
		req.Header.Set("Cookie", "airlock_session="+cookie)
	}
	if csrf != "" {
		req.Header.Set("X-Airlock-CSRF", csrf)
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp
}

// TestDashboardSessionNeedsCSRF: the dashboard's session cookie
// authenticates an API call only with the session's CSRF token from a
// same-origin page; a cross-origin page, a missing or wrong token, or a
// logged-out session are refused, and the cookie is HttpOnly and
// SameSite=Strict. The page itself carries a strict CSP.
func TestDashboardSessionNeedsCSRF(t *testing.T) {
	e := newE2E(t, "dash-csrf")
	base := e.s.URL
	self := base // Origin of the dashboard's own pages

	code, body, resp := dashReq(t, "GET", base+"/", "", "", "", "")
	if code != 200 || !strings.Contains(body, "/ui/app.js") {
		t.Fatalf("GET /: %d %s", code, body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self';") || strings.Contains(csp, "unsafe-eval") {
		t.Fatalf("CSP %q", csp)
	}

	// Login needs the header and a same-origin Origin (no login CSRF).
	login := `{"key":"` + e.key + `"}`
	if code, body, _ := dashReq(t, "POST", base+"/ui/session", "", "", self, login); code != 403 {
		t.Fatalf("login without the CSRF header: %d %s", code, body)
	}
	if code, body, _ := dashReq(t, "POST", base+"/ui/session", "", "x", "http://evil.example", login); code != 403 {
		t.Fatalf("cross-origin login: %d %s", code, body)
	}
	if code, body, _ := dashReq(t, "POST", base+"/ui/session", "", "x", self, `{"key":"al_wrong"}`); code != 401 {
		t.Fatalf("login with a wrong key: %d %s", code, body)
	}
	code, body, resp = dashReq(t, "POST", base+"/ui/session", "", "x", self, login)
	if code != 200 {
		t.Fatalf("login: %d %s", code, body)
	}
	var sess struct{ CSRF string }
	json.Unmarshal([]byte(body), &sess)
	var cookie string
	for _, c := range resp.Cookies() {
		if c.Name == "airlock_session" {
			cookie = c.Value
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure {
				t.Errorf("cookie flags: HttpOnly %v SameSite %v Secure %v (plain HTTP)", c.HttpOnly, c.SameSite, c.Secure)
			}
		}
	}
	if cookie == "" || sess.CSRF == "" || strings.Contains(body, e.key) || strings.Contains(cookie, e.key) {
		t.Fatalf("session: cookie %q body %s", cookie, body)
	}

	list := base + "/v1/sandboxes"
	for _, c := range []struct{ csrf, origin string }{{"", ""}, {"wrong", ""}, {"", self}} {
		if code, body, _ := dashReq(t, "GET", list, cookie, c.csrf, c.origin, ""); code != 401 && code != 403 {
			t.Errorf("cookie with csrf %q origin %q: %d %s", c.csrf, c.origin, code, body)
		}
	}
	if code, body, _ := dashReq(t, "POST", list, cookie, sess.CSRF, "http://evil.example", "{}"); code != 403 {
		t.Errorf("cross-origin create with the right token: %d %s", code, body)
	}
	if code, body, _ := dashReq(t, "GET", list, cookie, sess.CSRF, "", ""); code != 200 {
		t.Errorf("cookie with its token: %d %s", code, body)
	}
	if code, body, _ := dashReq(t, "POST", list, cookie, sess.CSRF, self, `{"timeout":600}`); code != 201 && code != 200 {
		t.Errorf("same-origin create with the token: %d %s", code, body)
	}
	// A bearer key from a page is still refused (the API's Origin check).
	req, _ := http.NewRequest("GET", list, nil)
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Origin", "http://evil.example")
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode != 403 {
		t.Errorf("bearer from a cross-origin page: %v %v", r.StatusCode, err)
	}

	// The terminal's WebSocket: a browser cannot add the CSRF header to the
	// handshake, so the cookie counts there with this server's Origin only.
	sbs, err := e.c.List(e.ctx, nil)
	if err != nil || len(sbs) == 0 {
		t.Fatalf("list: %v %v", sbs, err)
	}
	pty := "ws" + strings.TrimPrefix(base, "http") + "/v1/sandboxes/" + sbs[0].ID + "/pty"
	for _, origin := range []string{"http://evil.example", ""} {
		h := http.Header{"Cookie": {"airlock_session=" + cookie}}
		if origin != "" {
			h.Set("Origin", origin)
		}
		c, resp, err := websocket.Dial(e.ctx, pty, &websocket.DialOptions{HTTPHeader: h})
		if err == nil {
			c.CloseNow()
			t.Fatalf("terminal WebSocket with the cookie from origin %q opened", origin)
		}
		if resp == nil || (resp.StatusCode != 403 && resp.StatusCode != 401) {
			t.Fatalf("terminal WebSocket from origin %q: %v %v", origin, resp, err)
		}
	}
	c, _, err := websocket.Dial(e.ctx, pty, &websocket.DialOptions{HTTPHeader: http.Header{"Cookie": {"airlock_session=" + cookie}, "Origin": {self}}})
	if err != nil {
		t.Fatalf("terminal WebSocket from the dashboard's origin: %v", err)
	}
	c.CloseNow()

	// Neither the session cookie nor its token reaches the sandbox, nor
	// any other cookie of the API's origin (the ports relay passes none).
	script := `import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("cookie=%s csrf=%s" % (self.headers.get("Cookie"), self.headers.get("X-Airlock-CSRF"))).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 8124), H).serve_forever()
`
	if _, err := e.c.WriteFile(e.ctx, sbs[0].ID, "/workspace/echo.py", strings.NewReader(script), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Start(e.ctx, sbs[0].ID, client.ExecRequest{Argv: []string{"python3", "echo.py"}}); err != nil {
		t.Fatal(err)
	}
	var relayed string
	eventually(t, 20*time.Second, "the sandbox's server to answer through the ports relay", func() bool {
		req, _ := http.NewRequest("GET", base+"/v1/sandboxes/"+sbs[0].ID+"/ports/8124/", nil)
		req.Header.Set("Cookie", "theme=dark; airlock_session="+cookie+"; lang=en")
		req.Header.Set("X-Airlock-CSRF", sess.CSRF)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		relayed = string(b)
		return resp.StatusCode == 200
	})
	if relayed != "cookie=None csrf=None" {
		t.Fatalf("the sandbox got %q", relayed)
	}

	if code, body, _ := dashReq(t, "DELETE", base+"/ui/session", cookie, sess.CSRF, self, ""); code != 200 {
		t.Fatalf("logout: %d %s", code, body)
	}
	if code, body, _ := dashReq(t, "GET", list, cookie, sess.CSRF, "", ""); code != 401 {
		t.Errorf("after logout: %d %s", code, body)
	}
}

// TestDashboardNoAuth: on a loopback --no-auth server the dashboard opens
// without logging in, its same-origin calls work, and a cross-origin page
// is still refused.
func TestDashboardNoAuth(t *testing.T) {
	needRoot(t)
	s := startServer(t, stateDir(t), "--no-auth")
	code, body, resp := dashReq(t, "GET", s.URL+"/ui/session", "", "", "", "")
	if code != 200 || !strings.Contains(body, `"no_auth":true`) || !strings.Contains(body, `"authenticated":true`) {
		t.Fatalf("session on --no-auth: %d %s", code, body)
	}
	var sess struct{ CSRF string }
	json.Unmarshal([]byte(body), &sess)
	var cookie string
	for _, c := range resp.Cookies() {
		if c.Name == "airlock_session" && c.HttpOnly && c.SameSite == http.SameSiteStrictMode {
			cookie = c.Value
		}
	}
	if cookie == "" || len(sess.CSRF) < 32 {
		t.Fatalf("--no-auth session: cookie %q token %q, want an HttpOnly SameSite=Strict cookie and its token", cookie, sess.CSRF)
	}
	// The token is the session's: a made-up one, or the right one without
	// the session's cookie or with another session's, does nothing.
	_, other, _ := dashReq(t, "GET", s.URL+"/ui/session", "", "", "", "")
	var otherSess struct{ CSRF string }
	json.Unmarshal([]byte(other), &otherSess)
	for _, c := range []struct{ cookie, csrf string }{{"", "no-auth"}, {cookie, "no-auth"}, {cookie, "x"}, {"", sess.CSRF},
		{"forged", sess.CSRF}, {cookie, otherSess.CSRF}} {
		if code, body, _ := dashReq(t, "POST", s.URL+"/v1/sandboxes", c.cookie, c.csrf, s.URL, `{"timeout":600}`); code != 403 {
			t.Errorf("create with cookie %q token %q: %d %s, want 403", c.cookie, c.csrf, code, body)
		}
	}
	if code, body, _ := dashReq(t, "POST", s.URL+"/v1/sandboxes", cookie, sess.CSRF, s.URL, `{"timeout":600}`); code != 201 && code != 200 {
		t.Fatalf("same-origin create: %d %s", code, body)
	}
	// A program (no Origin, no Sec-Fetch-Site) needs nothing.
	if code, body, _ := dashReq(t, "GET", s.URL+"/v1/sandboxes", "", "", "", ""); code != 200 {
		t.Fatalf("a program's call: %d %s", code, body)
	}
	if code, body, _ := dashReq(t, "POST", s.URL+"/v1/sandboxes", "", "no-auth", "http://evil.example", `{}`); code != 403 {
		t.Fatalf("cross-origin create: %d %s", code, body)
	}
	if code, body, _ := dashReq(t, "POST", s.URL+"/ui/session", "", "x", s.URL, `{"key":"al_x"}`); code != 400 {
		t.Fatalf("login on --no-auth: %d %s", code, body)
	}
}
