package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// attackPage is what a hostile sandbox serves: opened at the documented
// ports URL on a --no-auth server, its script tries to read another
// sandbox's files (fetch, with and without a CSRF header, the dashboard's
// token, and as a script), to run a command there and to create a
// sandbox, and records what it got in window.__out.
const attackPage = `<!doctype html><title>loading</title><script>
(async () => {
  const B = "SANDBOX_B", out = {};
  const step = async (name, f) => { try { out[name] = await f(); } catch (e) { out[name] = "ERR " + e; } };
  const text = async r => r.status + " " + await r.text();
  let csrf = "x";
  await step("session", async () => { const r = await fetch("/ui/session"); const s = await r.text(); try { csrf = JSON.parse(s).csrf || csrf; } catch (e) {} return s; });
  await step("read", () => fetch("/v1/sandboxes/" + B + "/files?path=/workspace/secret.txt").then(text));
  await step("read_csrf", () => fetch("/v1/sandboxes/" + B + "/files?path=/workspace/secret.txt", {headers: {"X-Airlock-CSRF": csrf}}).then(text));
  await step("exec", () => fetch("/v1/sandboxes/" + B + "/exec", {method: "POST", headers: {"X-Airlock-CSRF": csrf, "Content-Type": "application/json"},
    body: JSON.stringify({argv: ["touch", "/workspace/pwned"]})}).then(text));
  await step("exec_simple", () => fetch("/v1/sandboxes/" + B + "/exec", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
    body: JSON.stringify({argv: ["touch", "/workspace/pwned2"]})}).then(r => r.type));
  await step("create", () => fetch("/v1/sandboxes", {method: "POST", headers: {"X-Airlock-CSRF": csrf, "Content-Type": "application/json"}, body: "{}"}).then(text));
  await step("script", () => new Promise(res => { const s = document.createElement("script");
    s.src = "/v1/sandboxes/" + B + "/files?path=/workspace/leak.js"; s.onload = () => res("loaded " + window.__leak); s.onerror = () => res("blocked");
    document.head.appendChild(s); }));
  await step("origin", async () => String(window.origin));
  window.__out = out;
  document.title = "done";
})();
</script>`

// TestRelayPageCannotDriveTheAPI: on a --no-auth server, a page a
// sandbox serves, opened in a browser at /v1/sandboxes/ID/ports/8000/,
// cannot act on the API: it runs as a sandboxed document of an opaque
// origin (Content-Security-Policy: sandbox), so its calls go out
// cross-origin without the dashboard's cookie and cannot read the CSRF
// token; another sandbox's secret is not read, no command runs and no
// sandbox is created. On 2a43161 the page read the secret and ran the
// command.
func TestRelayPageCannotDriveTheAPI(t *testing.T) {
	needRoot(t)
	s := startServer(t, stateDir(t), "--no-auth")
	b := newBrowser(t)
	json200 := map[string]string{"Content-Type": "application/json"}
	mk := func() string {
		st, body := send(t, "POST", s.URL+"/v1/sandboxes", json200, []byte(`{"timeout":600}`))
		var sb struct{ ID string }
		if st != 201 || json.Unmarshal([]byte(body), &sb) != nil {
			t.Fatalf("create: %d %s", st, body)
		}
		return sb.ID
	}
	a, victim := mk(), mk()
	put := func(id, path, data string) {
		t.Helper()
		if st, body := send(t, "PUT", s.URL+"/v1/sandboxes/"+id+"/files?path="+path, nil, []byte(data)); st/100 != 2 {
			t.Fatalf("write %s: %d %s", path, st, body)
		}
	}
	const secret = "TOPSECRET-d41d8cd98f"
	put(victim, "/workspace/secret.txt", secret)
	put(victim, "/workspace/leak.js", `window.__leak = "`+secret+`";`)
	put(a, "/workspace/site/index.html", strings.ReplaceAll(attackPage, "SANDBOX_B", victim))
	if st, body := send(t, "POST", s.URL+"/v1/sandboxes/"+a+"/exec", json200, []byte(
		`{"argv":["/usr/bin/python3","-m","http.server","8000","--bind","127.0.0.1","--directory","/workspace/site"],"background":true}`)); st/100 != 2 {
		t.Fatalf("start the page's server: %d %s", st, body)
	}
	page := s.URL + "/v1/sandboxes/" + a + "/ports/8000/index.html"
	eventually(t, 60*time.Second, "the sandbox's page", func() bool {
		st, _ := send(t, "GET", page, nil, nil)
		return st == 200
	})
	st0, list0 := send(t, "GET", s.URL+"/v1/sandboxes", nil, nil)

	b.run(t, "open the sandbox's page", chromedp.Navigate(page))
	b.waitJS(t, `document.title === "done"`, `document.title`, "the page's script")
	out, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`JSON.stringify(window.__out)`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("what the page got: %s", out)
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) < 7 {
		t.Fatalf("the page's script did not run its steps: %q %v", out, err)
	}
	if strings.Contains(out, secret) {
		t.Errorf("the page read the other sandbox's secret: %s", out)
	}
	if got["origin"] != "null" {
		t.Errorf("the page runs in origin %q, want an opaque one (null)", got["origin"])
	}
	for _, f := range []string{"pwned", "pwned2"} {
		if st, body := send(t, "GET", s.URL+"/v1/sandboxes/"+victim+"/files/stat?path=/workspace/"+f, nil, nil); st != 404 {
			t.Errorf("the page ran a command in the other sandbox (%s: %d %s)", f, st, body)
		}
	}
	if st, list := send(t, "GET", s.URL+"/v1/sandboxes", nil, nil); st != st0 || strings.Count(list, `"id":"sb-`) != strings.Count(list0, `"id":"sb-`) {
		t.Errorf("the page created a sandbox: before %s, after %s", list0, list)
	}
	// The dashboard itself still works without authentication: it reads
	// its session's token and lists the sandboxes.
	b.run(t, "open the dashboard", chromedp.Navigate(s.URL+"/"))
	b.waitText(t, "#sandboxes", victim)

	// The relay's answer is a sandboxed document, of an opaque origin.
	resp, err := http.Get(page)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	csp := strings.Join(resp.Header.Values("Content-Security-Policy"), ", ")
	if !strings.Contains(csp, "sandbox") || strings.Contains(csp, "allow-same-origin") {
		t.Errorf("relay answer's CSP %q: want sandbox without allow-same-origin", csp)
	}
}
