package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// TestPortsEndpoint reaches Python's http.server inside a sandbox through
// /v1/sandboxes/{id}/ports/{port}/...: the path and query arrive as the
// server's own, the API key does not reach the sandbox, another key gets
// a 404 and a closed port a 502.
func TestPortsEndpoint(t *testing.T) {
	state := stateDir(t)
	key := newKey(t, state, "ports")
	other := newKey(t, state, "other")
	s := startServer(t, state)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.ID)
	// The server echoes the request line and the Authorization it got.
	script := `import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("%s auth=%s" % (self.path, self.headers.get("Authorization"))).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
http.server.HTTPServer(("127.0.0.1", 8123), H).serve_forever()
`
	if _, err := c.WriteFile(ctx, sb.ID, "/workspace/srv.py", strings.NewReader(script), 0o644); err != nil {
		t.Fatal(err)
	}
	get := func(k, path string) (int, string) {
		req, _ := http.NewRequest("GET", s.URL+"/v1/sandboxes/"+sb.ID+"/ports/"+path, nil)
		req.Header.Set("Authorization", "Bearer "+k)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, body := get(key, "8123/"); st != 502 || !strings.Contains(body, "nothing listens on port 8123") {
		t.Fatalf("closed port: %d %s", st, body)
	}
	if _, err := c.Start(ctx, sb.ID, client.ExecRequest{Argv: []string{"python3", "srv.py"}}); err != nil {
		t.Fatal(err)
	}
	var st int
	var body string
	for i := 0; i < 200; i++ { // until it listens
		if st, body = get(key, "8123/a/b?x=1"); st != 502 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st != 200 || body != "/a/b?x=1 auth=None" {
		t.Fatalf("through the ports endpoint: %d %q", st, body)
	}
	if st, body := get(other, "8123/"); st != 404 {
		t.Fatalf("another key: %d %s", st, body)
	}
	if st, _ := get(key, "99999/"); st != 400 {
		t.Fatalf("bad port: %d", st)
	}
}
