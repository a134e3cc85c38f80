package desktop_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testbrowser"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// chromium is a headless Chromium (package testbrowser).
type chromium struct {
	ctx context.Context
	tb  *testbrowser.Browser
}

func newChromium(t *testing.T) *chromium {
	t.Helper()
	// The links' host names (l-ID.localhost) on the test server's address.
	tb := testbrowser.Start(t, 10*time.Minute, chromedp.Flag("host-resolver-rules", "MAP *.localhost 127.0.0.1"))
	return &chromium{ctx: tb.Ctx, tb: tb}
}

func (c *chromium) do(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(c.ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// until evaluates the JavaScript expression expr in ctx (a page or a
// frame) every 250 ms until it is true. No context derived from ctx:
// cancelling one detaches chromedp from a frame's target.
func until(t *testing.T, ctx context.Context, expr, show, what string) {
	t.Helper()
	end := time.Now().Add(3 * time.Minute)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return
		}
		if time.Now().After(end) {
			got, _ := chromedp.Run(ctx, chromedp.Evaluate[string](show))
			t.Fatalf("waiting for %s: %v (the page holds %q)", what, err, got)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// frame attaches to the frame (an out-of-process iframe: its origin is
// another site) whose URL contains sub.
func (c *chromium) frame(t *testing.T, sub string) (context.Context, *target.Info) {
	t.Helper()
	var info *target.Info
	waitFor(t, "a frame at "+sub, 2*time.Minute, func() bool {
		ts, err := chromedp.Targets(c.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range ts {
			if ti.Type == "iframe" && strings.Contains(ti.URL, sub) {
				info = ti
				return true
			}
		}
		return false
	})
	fctx, cancel := chromedp.NewContext(c.ctx, chromedp.WithTargetID(info.TargetID))
	t.Cleanup(cancel)
	if err := chromedp.Do(fctx); err != nil {
		t.Fatalf("attach to the frame at %s: %v", info.URL, err)
	}
	return fctx, info
}

// connected: noVNC says so (the class it puts on the document) and its
// canvas holds a picture, not one flat colour.
const connected = `(() => {
  if (!document.documentElement.classList.contains("noVNC_connected")) return false;
  const c = [...document.querySelectorAll("canvas")].find(c => c.width >= 640);
  if (!c) return false;
  const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  const seen = new Set();
  for (let i = 0; i < d.length; i += 4 * 97) seen.add(d[i] << 16 | d[i+1] << 8 | d[i+2]);
  return seen.size >= 8;
})()`

const frameState = `document.documentElement.className + " " + ((document.getElementById("noVNC_status") || {}).textContent || "")`

// testDesktopView: the dashboard's desktop view shows a desktop sandbox
// live in headless Chromium: noVNC in a frame on the link's own origin
// (not the dashboard's: it cannot reach the dashboard's document or API),
// connected, with a picture; read-only, keys typed into it do not reach
// the focused xterm; after "Take over" they do.
func testDesktopView(t *testing.T, h *humanEnv, runtime string) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	id := h.desktopWith(t, ctx, runtime, "Notes")
	// The xterm covers the screen's middle: a click in the view's centre
	// lands on it.
	h.sh(t, ctx, id, `xdotool search --name '^Notes$' windowmove 112 84 windowsize 800 600`)
	h.focus(t, ctx, id, "Notes")

	c := newChromium(t)
	c.do(t, "open", chromedp.Navigate(h.s.URL+"/"), chromedp.WaitVisible(chromedp.ID("key")))
	c.do(t, "log in", chromedp.SendKeys(chromedp.ID("key"), h.key), chromedp.Click(chromedp.CSS(`#login button[type=submit]`)))
	until(t, c.ctx, `document.getElementById("who").textContent.includes("key ")`, `document.getElementById("who").textContent`, "the login")
	c.do(t, "open the sandbox", chromedp.Navigate(h.s.URL+"/#/sb/"+id), chromedp.WaitVisible(chromedp.ID("desktop-link")))
	c.do(t, "open its desktop", chromedp.Click(chromedp.ID("desktop-link")))
	until(t, c.ctx, `document.getElementById("desktop-status").textContent.includes("watching")`,
		`document.getElementById("main").innerText`, "the view's links")

	fctx, info := c.frame(t, "view_only=1")
	fu, err := url.Parse(info.URL)
	if err != nil {
		t.Fatal(err)
	}
	du, _ := url.Parse(h.s.URL)
	if !strings.HasPrefix(fu.Hostname(), "l-") || !strings.HasSuffix(fu.Hostname(), ".localhost") || fu.Host == du.Host {
		t.Fatalf("noVNC is at %s: want a link's own origin, not the dashboard's %s", fu.Host, du.Host)
	}
	until(t, fctx, connected, frameState, "noVNC connected, showing the desktop")

	// The sandbox's page cannot reach the dashboard: not its document, not
	// its API with the browser's session.
	probe, err := chromedp.Run(fctx, chromedp.Evaluate[string](fmt.Sprintf(`(() => {
	  const out = [];
	  try { out.push("top document: " + window.top.document.title); } catch (e) { out.push("top document refused"); }
	  const x = new XMLHttpRequest();
	  try { x.open("GET", %q + "/v1/sandboxes", false); x.withCredentials = true; x.send(); out.push("api: " + x.status + " " + x.responseText); } catch (e) { out.push("api refused"); }
	  return out.join("; ");
	})()`, h.s.URL)))
	if err != nil || probe != "top document refused; api refused" {
		t.Fatalf("from the sandbox's page: %q, %v", probe, err)
	}
	if dir := os.Getenv("AIRLOCK_DASHBOARD_SHOTS"); dir != "" && runtime == "native" {
		png, err := chromedp.Run(c.ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "desktop.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	centre, err := chromedp.Run(c.ctx, chromedp.Evaluate[[]float64](`(() => { const r = document.getElementById("desktop").getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()`))
	if err != nil {
		t.Fatal(err)
	}
	typeInto := func(text string) {
		t.Helper()
		c.do(t, "click and type "+text, chromedp.MouseClickXY(centre[0], centre[1]), chromedp.Sleep(500*time.Millisecond), chromedp.KeyEvent(text))
	}
	// Read-only: the keys are dropped.
	typeInto("viewonly")
	time.Sleep(3 * time.Second)
	if got := h.logOf(t, ctx, id, "/tmp/notes.log"); got != "" {
		t.Fatalf("keys typed into the read-only view reached the xterm: %q", got)
	}

	// Take over: the same keys arrive.
	c.do(t, "take over", chromedp.Click(chromedp.ID("take-over")))
	until(t, c.ctx, `document.getElementById("desktop").dataset.mode === "control"`, `document.getElementById("main").innerText`, "control mode")
	// The same origin: Chromium may keep the frame's process and target.
	if fctx2, info2 := c.frame(t, "view_only=0"); info2.TargetID != info.TargetID {
		fctx = fctx2
	}
	until(t, fctx, `location.search.includes("view_only=0") && `+connected, frameState, "noVNC connected again, taking input")
	typeInto("takeover")
	waitFor(t, "the keys typed after taking over in the xterm's log", time.Minute, func() bool {
		return h.logOf(t, ctx, id, "/tmp/notes.log") == "takeover"
	})
	for _, e := range c.tb.Errors() {
		t.Errorf("dashboard page: %s", e)
	}
}

// echoServer answers every request with the headers and path it got.
const echoServer = `import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "tossed=1; Domain=localhost; Path=/")
        self.end_headers()
        self.wfile.write(b)
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
`

// other is secret with its last character changed.
func other(secret string) string {
	last := "a"
	if strings.HasSuffix(secret, "a") {
		last = "b"
	}
	return secret[:len(secret)-1] + last
}

// testLinkCredentials: a link (POST .../links) passes no credential of
// the viewer's to the sandbox (no cookie, API key, CSRF token, nor the
// Referer that holds its secret, which is not in the path the sandbox
// sees either), answers only its own secret on its own host, refuses
// pages of other origins, and ends with its sandbox and with its key.
func testLinkCredentials(t *testing.T, h *humanEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := h.desktop(t, ctx, "native")
	if _, err := h.c.WriteFile(ctx, id, "/tmp/echo.py", strings.NewReader(echoServer), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Start(ctx, id, client.ExecRequest{Argv: []string{"python3", "/tmp/echo.py"}, Background: true}); err != nil {
		t.Fatal(err)
	}
	h.sh(t, ctx, id, `timeout 60 sh -c 'until python3 -c "import urllib.request; urllib.request.urlopen(\"http://127.0.0.1:8000/\")" 2>/dev/null; do sleep 0.3; done'`)
	var link struct {
		URL string `json:"url"`
	}
	if st := h.asKey(t, ctx, h.key, "POST", "/v1/sandboxes/"+id+"/links", map[string]int{"port": 8000}, &link); st != 200 {
		t.Fatalf("POST links: HTTP %d", st)
	}
	lu, err := url.Parse(link.URL)
	if err != nil || !strings.HasPrefix(lu.Hostname(), "l-") {
		t.Fatalf("link %q: %v", link.URL, err)
	}
	secret := strings.Trim(lu.Path, "/")
	server, _ := url.Parse(h.s.URL)
	// Every host name to the test server (*.localhost needs no DNS).
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, server.Host)
	}}}
	get := func(u string, hdr map[string]string) (int, map[string]any, http.Header) {
		req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body, resp.Header
	}
	st, body, hdr := get(link.URL+"page?x=1", map[string]string{
		"Cookie": "airlock_session=viewer-session; other=1", "Authorization": "Bearer " + h.key,
		"X-Airlock-CSRF": "viewer-token", "Referer": link.URL + "vnc.html", "Origin": "http://" + lu.Host})
	if st != 200 {
		t.Fatalf("through the link: HTTP %d %v", st, body)
	}
	if body["path"] != "/page?x=1" {
		t.Errorf("the sandbox saw the path %v, want /page?x=1 (never the link's secret)", body["path"])
	}
	seen, _ := json.Marshal(body["headers"])
	for _, leak := range []string{"viewer-session", h.key, "viewer-token", secret, `"cookie"`, `"authorization"`, `"referer"`} {
		if strings.Contains(string(seen), leak) {
			t.Errorf("the sandbox got %q: %s", leak, seen)
		}
	}
	if c := hdr.Values("Set-Cookie"); len(c) != 0 {
		t.Errorf("a sandbox's cookie for the whole domain passed: %q", c)
	}
	for _, bad := range []struct {
		url    string
		hdr    map[string]string
		status int
	}{
		{link.URL + "page", map[string]string{"Origin": h.s.URL}, 403},                                         // another origin's page
		{"http://" + lu.Host + "/" + other(secret) + "/page", nil, 404},                                        // not its secret
		{"http://l-" + strings.Repeat("a", 26) + ".localhost:" + lu.Port() + "/" + secret + "/page", nil, 404}, // its secret on another host
	} {
		if st, _, _ := get(bad.url, bad.hdr); st != bad.status {
			t.Errorf("GET %s %v: HTTP %d, want %d", bad.url, bad.hdr, st, bad.status)
		}
	}
	if err := h.c.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := get(link.URL+"page", nil); st != 404 {
		t.Errorf("after the kill: HTTP %d, want 404", st)
	}

	// A link ends with its key: another key's sandbox and link, then the
	// key revoked.
	viewer := testserver.NewKey(t, h.state, "viewer")
	vc := client.New(h.s.URL, viewer)
	sb, err := vc.Create(ctx, client.CreateRequest{Image: "desktop", Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	// Killed with the server (its key is revoked below).
	if _, err := vc.WriteFile(ctx, sb.ID, "/tmp/echo.py", strings.NewReader(echoServer), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := vc.Start(ctx, sb.ID, client.ExecRequest{Argv: []string{"python3", "/tmp/echo.py"}, Background: true}); err != nil {
		t.Fatal(err)
	}
	if st := h.asKey(t, ctx, viewer, "POST", "/v1/sandboxes/"+sb.ID+"/links", map[string]int{"port": 8000}, &link); st != 200 {
		t.Fatalf("POST links as the viewer: HTTP %d", st)
	}
	waitFor(t, "the viewer's link to answer", time.Minute, func() bool { st, _, _ := get(link.URL+"page", nil); return st == 200 })
	if out, err := exec.Command(testserver.Binary(t), "keys", "revoke", "--state-dir", h.state, keyIDIn(t, h.state, "viewer")).CombinedOutput(); err != nil {
		t.Fatalf("keys revoke: %v %s", err, out)
	}
	if st, body, _ := get(link.URL+"page", nil); st != 403 {
		t.Errorf("the link of a revoked key: HTTP %d %v, want 403", st, body)
	}
}
