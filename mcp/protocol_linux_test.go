package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/store"
)

// TestRunCodeDefaultLanguage: run_code without a language runs Python,
// like POST /code does, and the schema says so.
func TestRunCodeDefaultLanguage(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	if out := mustOK(t, cs, "run_code", map[string]any{"code": "import sys\n(6 * 7, sys.version_info[0])"}); !strings.Contains(out, "(42, 3)") {
		t.Fatalf("run_code without language: %q", out)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if tool.Name != "run_code" {
			continue
		}
		b, _ := json.Marshal(tool.InputSchema)
		if strings.Contains(string(b), `"required":["language"`) || strings.Contains(string(b), `"language","code"`) || !strings.Contains(string(b), `"default":"python"`) {
			t.Errorf("run_code schema: %s", b)
		}
	}
}

// TestPathsRefuseDotDot: the file tools refuse ".." like the HTTP API
// instead of resolving "../x" to "/x".
func TestPathsRefuseDotDot(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"write_file", map[string]any{"path": "../x", "content": "no"}},
		{"write_file", map[string]any{"path": "/workspace/a/../../tmp/x", "content": "no"}},
		{"read_file", map[string]any{"path": "../etc/passwd"}},
		{"list_files", map[string]any{"path": ".."}},
	} {
		if out := mustFail(t, cs, c.tool, c.args); !strings.Contains(out, "'..'") {
			t.Errorf("%s %v: %q", c.tool, c.args, out)
		}
	}
	mustOK(t, cs, "write_file", map[string]any{"path": "ok/x.txt", "content": "yes"})
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "cat /workspace/ok/x.txt; ls /x 2>&1 || true"}); !strings.Contains(out, "yes") || !strings.Contains(out, "No such file") {
		t.Fatalf("got %q", out)
	}
}

// rawConn drives a session with hand-written JSON-RPC messages.
type rawConn struct {
	t    *testing.T
	conn sdk.Connection
	seen map[string]bool // ids of the responses read
}

func (c *rawConn) send(msg string) {
	c.t.Helper()
	m, err := jsonrpc.DecodeMessage([]byte(msg))
	if err != nil {
		c.t.Fatalf("%s: %v", msg, err)
	}
	if err := c.conn.Write(context.Background(), m); err != nil {
		c.t.Fatal(err)
	}
}

// until reads messages until the response to id arrives and returns it.
func (c *rawConn) until(id int64) *jsonrpc.Response {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		m, err := c.conn.Read(ctx)
		if err != nil {
			c.t.Fatalf("waiting for response %d: %v", id, err)
		}
		if r, ok := m.(*jsonrpc.Response); ok {
			c.seen[fmt.Sprint(r.ID.Raw())] = true
			if r.ID.Raw() == id {
				return r
			}
		}
	}
}

// TestCancelledRequestGetsNoResponse: over the stdio path (Service.Run), a
// request the client cancels with notifications/cancelled gets no
// response, and the session goes on.
func TestCancelledRequestGetsNoResponse(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, ct := sdk.NewInMemoryTransports()
	go e.svc.Run(ctx, st)
	conn, err := ct.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := &rawConn{t: t, conn: conn, seen: map[string]bool{}}
	c.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	c.until(1)
	c.send(`{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`)
	c.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"touch /tmp/started; sleep 60"}}}`)
	// Cancel once the command runs; then wait until it is gone, so that
	// the cancelled call's handler has returned.
	for i := int64(100); ; i++ {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"test -e /tmp/started"}}}`, i))
		if r := c.until(i); !strings.Contains(string(r.Result), `"isError":true`) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"user pressed stop"}}`)
	// The cancelled call's handler audits the command just before it
	// returns: wait for that record, then check nothing answers id 2.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		evs, err := e.st.AuditLog(context.Background(), store.AuditFilter{Action: store.ActionExec + ".result"})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, ev := range evs {
			found = found || strings.Contains(string(ev.Detail), "sleep 60")
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cancelled command was never audited")
		}
	}
	c.send(`{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	c.until(3)
	if c.seen["2"] {
		t.Fatal("the cancelled request was answered")
	}
}

// rpcPost POSTs one JSON-RPC message to an MCP endpoint, on a fresh
// connection, and returns the status, content type and body.
func rpcPost(t *testing.T, url, session, msg string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(msg))
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(bufio.NewReader(resp.Body))
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// TestHTTPProtocol: over streamable HTTP, a client that reconnects with
// its session id gets the same session and sandbox; an unknown method gets
// JSON-RPC error -32601; a cancelled request gets no response.
func TestHTTPProtocol(t *testing.T) {
	e := newEnv(t, nil)
	ts := httptest.NewServer(e.svc.HTTPHandler())
	defer ts.Close()
	tr := &sdk.StreamableClientTransport{Endpoint: ts.URL}
	a, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	mustOK(t, a, "write_file", map[string]any{"path": "keep.txt", "content": "kept across connections"})

	// A new connection with the same session id: same sandbox.
	code, _, body := rpcPost(t, ts.URL, a.ID(), `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"keep.txt"}}}`)
	if code != http.StatusOK || !strings.Contains(body, "kept across connections") {
		t.Fatalf("reconnect: %d %q", code, body)
	}

	// Unknown method: a JSON-RPC error, not a plain-text 400.
	code, ctype, body := rpcPost(t, ts.URL, a.ID(), `{"jsonrpc":"2.0","id":7,"method":"bogus/method","params":{}}`)
	var resp struct {
		ID    int64 `json:"id"`
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil || code != http.StatusOK || ctype != "application/json" ||
		resp.ID != 7 || resp.Error.Code != -32601 || !strings.Contains(resp.Error.Message, "bogus/method") {
		t.Fatalf("unknown method: %d %q %q (%v)", code, ctype, body, err)
	}

	// Cancelled: the POST that carried the request ends without its response.
	done := make(chan string, 1)
	go func() {
		_, _, body := rpcPost(t, ts.URL, a.ID(), `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"touch /tmp/started8; sleep 60"}}}`)
		done <- body
	}()
	for {
		if out := call(t, a, "run_command", map[string]any{"command": "test -e /tmp/started8"}); !out.IsError {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _, body := rpcPost(t, ts.URL, a.ID(), `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":8}}`); code != http.StatusAccepted {
		t.Fatalf("cancel: %d %q", code, body)
	}
	select {
	case body := <-done:
		if strings.Contains(body, `"id":8`) {
			t.Fatalf("the cancelled request was answered: %q", body)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the cancelled request's POST never ended")
	}
	mustOK(t, a, "run_command", map[string]any{"command": "true"})
}

// TestServeOAuthDiscoveryAndIdle: a real `airlock serve` answers MCP
// clients' OAuth discovery with RFC 9728 metadata that names no
// authorization server (and 404s that say a bearer key is the way in), and
// --mcp-idle ends an idle session and kills its sandbox.
func TestServeOAuthDiscoveryAndIdle(t *testing.T) {
	s := startServe(t, "--mcp-idle", "2s")
	for _, c := range []struct {
		path string
		code int
		want []string
	}{
		{"/.well-known/oauth-protected-resource", 200, []string{`"resource":"` + s.URL + `/mcp"`, `"authorization_servers":[]`, `"bearer_methods_supported":["header"]`, "Authorization: Bearer al_"}},
		{"/.well-known/oauth-protected-resource/mcp", 200, []string{`"resource":"` + s.URL + `/mcp"`}},
		{"/.well-known/oauth-authorization-server", 404, []string{"does not use OAuth", "Authorization: Bearer al_"}},
		{"/.well-known/openid-configuration", 404, []string{"does not use OAuth"}},
	} {
		resp, err := http.Get(s.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %s %q", c.path, resp.Status, resp.Header.Get("Content-Type"))
		}
		for _, w := range c.want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s: body lacks %q: %s", c.path, w, b)
			}
		}
	}

	key := s.newKey(t, "idle")
	cs := httpSession(t, s.URL+"/mcp", key)
	mustOK(t, cs, "run_command", map[string]any{"command": "true"})
	id := ownSandbox(t, cs)
	s.waitGone(t, key, id) // idle for --mcp-idle: session and sandbox end
}
