package mcp_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/store"
)

// served is a running `airlock serve`.
type served struct{ *testserver.Server }

// startServe runs airlock serve on a free loopback port.
func startServe(t testing.TB, args ...string) *served {
	t.Helper()
	needRoot(t)
	return &served{testserver.Start(t, shortDir(t), args...)}
}

// newKey creates an API key with `airlock keys create`.
func (s *served) newKey(t testing.TB, name string) string {
	return testserver.NewKey(t, s.State, name)
}

// sandboxState asks the API for a sandbox's state.
func (s *served) sandboxState(t testing.TB, key, id string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", s.URL+"/v1/sandboxes/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		State string `json:"state"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET sandbox %s: %s %v", id, resp.Status, err)
	}
	return info.State
}

// waitGoneServed waits until the server recorded sandbox id as ended and
// its init process and cgroups are gone from the host.
func (s *served) waitGone(t testing.TB, key, id string) {
	t.Helper()
	st, err := store.Open(s.State)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if rec := waitGone(t, st, id); rec.State != store.StateKilled {
		t.Fatalf("sandbox %s ended as %s (%s)", id, rec.State, rec.EndReason)
	}
	if got := s.sandboxState(t, key, id); got != store.StateKilled {
		t.Fatalf("API says sandbox %s is %s", id, got)
	}
}

// TestServeMCP drives /mcp of a real `airlock serve` with the Go SDK: the
// API's bearer auth applies, tools act for the key, and the session's
// sandbox is gone once the client ends the session.
func TestServeMCP(t *testing.T) {
	s := startServe(t)
	key := s.newKey(t, "mcp")
	other := s.newKey(t, "other")

	// No or a wrong token: the API's 401 and error format.
	for _, tok := range []string{"", "al_wrong"} {
		req, _ := http.NewRequest("POST", s.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct{ Code string } `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != 401 || body.Error.Code != "unauthorized" {
			t.Fatalf("token %q: %s %+v", tok, resp.Status, body)
		}
	}

	cs := httpSession(t, s.URL+"/mcp", key)
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "echo via serve"}); out != "via serve\n\n" {
		t.Fatalf("got %q", out)
	}
	mustFail(t, cs, "run_command", map[string]any{"command": "bash -c ':(){ :|:& };:'"})
	mustFail(t, cs, "run_command", map[string]any{"command": "cat /etc/shadow"})
	mustOK(t, cs, "write_file", map[string]any{"path": "x", "content": "y"})
	if out := mustOK(t, cs, "read_file", map[string]any{"path": "x"}); out != "y\n" {
		t.Fatalf("read: %q", out)
	}
	// A large binary file fits in a request.
	big := bytes.Repeat([]byte{0, 1, 2, 3, 0xff}, 2<<20)
	mustOK(t, cs, "write_file", map[string]any{"path": "big.bin", "content": base64.StdEncoding.EncodeToString(big), "encoding": "base64"})
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "stat -c %s big.bin"}); out != "10485760\n\n" {
		t.Fatalf("big file: %q", out)
	}
	id := ownSandbox(t, cs)
	mustOK(t, cs, "run_code", py("x = 41"))
	if out := mustOK(t, cs, "run_code", py("x + 1")); strings.TrimSpace(out) != "42" {
		t.Fatalf("run_code: %q", out)
	}
	// The sandbox is the key's, visible through the REST API too.
	if got := s.sandboxState(t, key, id); got != "running" {
		t.Fatalf("API: %s", got)
	}
	oc := httpSession(t, s.URL+"/mcp", other)
	mustFail(t, oc, "read_file", map[string]any{"path": "x", "sandbox_id": id})

	cs.Close()
	s.waitGone(t, key, id)
}
