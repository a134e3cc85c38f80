package mcp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/mcp"
)

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// httpSession opens a streamable HTTP MCP session with a bearer token.
func httpSession(t testing.TB, url, token string) *sdk.ClientSession {
	t.Helper()
	tr := &sdk.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestHTTP drives the streamable HTTP handler behind a stand-in for the
// API's authentication: sessions act for their key, are bound to it, and
// their sandbox dies when they are closed or idle too long.
func TestHTTP(t *testing.T) {
	e := newEnv(t, func(c *mcp.Config) { c.SessionTimeout = 2 * time.Second })
	callers := map[string]mcp.Caller{"tok-a": {Owner: "key-a"}, "tok-b": {Owner: "key-b", MaxSandboxes: 1}}
	h := e.svc.HTTPHandler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := callers[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r.WithContext(mcp.WithCaller(r.Context(), c)))
	}))
	defer ts.Close()
	ctx := context.Background()

	a := httpSession(t, ts.URL, "tok-a")
	if out := mustOK(t, a, "run_command", map[string]any{"command": "echo over http"}); out != "over http\n\n" {
		t.Fatalf("got %q", out)
	}
	aBox := ownSandbox(t, a)
	if list, _ := e.m.List(ctx, "key-a", manager.ListOptions{}); len(list) != 1 || list[0].ID != aBox {
		t.Fatalf("key-a's sandboxes: %+v", list)
	}

	// Another key sees neither the sandbox nor the session.
	b := httpSession(t, ts.URL, "tok-b")
	mustFail(t, b, "run_command", map[string]any{"command": "true", "sandbox_id": aBox})
	mustFail(t, b, "kill_sandbox", map[string]any{"sandbox_id": aBox})
	if out := mustOK(t, b, "list_sandboxes", nil); strings.Contains(out, aBox) {
		t.Fatalf("key-b lists key-a's sandbox: %q", out)
	}
	mustOK(t, b, "run_command", map[string]any{"command": "true"})
	if out := mustFail(t, b, "create_sandbox", nil); !strings.Contains(out, "may run at most 1") {
		t.Fatalf("key limit: %q", out)
	}
	bBox := ownSandbox(t, b) // b is idle from here on
	req, _ := http.NewRequest("POST", ts.URL, strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"id"}}}`))
	req.Header.Set("Authorization", "Bearer tok-b")
	req.Header.Set("Mcp-Session-Id", a.ID())
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("key-b using key-a's session: %s", resp.Status)
	}

	// Closing the session (DELETE) kills its sandbox; a still works until.
	mustOK(t, a, "run_command", map[string]any{"command": "true"})
	a.Close()
	if rec := waitGone(t, e.st, aBox); rec.State != "killed" {
		t.Fatalf("a's sandbox: %s", rec.State)
	}

	// An idle session times out, and its sandbox with it.
	waitGone(t, e.st, bBox)
	if _, err := b.CallTool(ctx, &sdk.CallToolParams{Name: "list_sandboxes"}); err == nil {
		t.Fatal("timed-out session still answers")
	}
}
