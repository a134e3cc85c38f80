package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/e2b"
)

// bearerTransport adds a bearer token to every request.
type bearerTransport struct {
	token string
	rt    http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// send makes a request with the given headers and returns its status and
// body.
func send(t *testing.T, method, u string, hdr map[string]string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestE2EApprovalGatesWhatRuns: with a key policy refusing bash code
// cells and shell commands, no surface runs bash anyway: not a cell in a
// bash context that names no language (REST and E2B), not a new bash
// context (REST and E2B), not an alias of the language (sh, BASH), not a
// context that lies about its language, not MCP's run_code, not a shell
// through E2B's process API or the PTY. Each attempt is refused with the
// policy's reason and its marker file never appears.
func TestE2EApprovalGatesWhatRuns(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "agent")
	s := startServer(t, state)
	base := s.URL

	// Before the policy: an E2B sandbox with a bash context on each
	// surface (made while bash was still allowed).
	st, body := send(t, "POST", base+"/v2/sandboxes", map[string]string{"X-API-Key": key, "Content-Type": "application/json"},
		[]byte(`{"templateID":"base","timeout":600}`))
	if st != 201 {
		t.Fatalf("E2B create: %d %s", st, body)
	}
	var created struct {
		SandboxID, EnvdAccessToken, TrafficAccessToken string
	}
	if err := json.Unmarshal([]byte(body), &created); err != nil {
		t.Fatal(err)
	}
	id := created.SandboxID
	api := base + "/v1/sandboxes/" + id
	authz := map[string]string{"Authorization": "Bearer " + key, "Content-Type": "application/json"}
	interp := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49999",
		"E2b-Traffic-Access-Token": created.TrafficAccessToken, "Content-Type": "application/json"}
	envd := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983",
		"X-Access-Token": created.EnvdAccessToken, "Content-Type": "application/connect+json"}
	ctxID := func(st int, body string) string {
		t.Helper()
		var c struct{ ID string }
		if st != 200 && st != 201 || json.Unmarshal([]byte(body), &c) != nil || c.ID == "" {
			t.Fatalf("context: %d %s", st, body)
		}
		return c.ID
	}
	restCtx := ctxID(send(t, "POST", api+"/contexts", authz, []byte(`{"language":"bash"}`)))
	e2bCtx := ctxID(send(t, "POST", base+"/contexts", interp, []byte(`{"language":"bash"}`)))

	if err := approval.SaveKeyPolicy(state, keyID(t, state, "agent"), []byte(`{"deny":[
		{"action":"code","language":"bash","reason":"no bash here"},
		{"action":"exec","argv":"(^|/)(ba)?sh( |$)","reason":"no bash here"}]}`)); err != nil {
		t.Fatal(err)
	}

	cell := func(mark, extra string) []byte {
		return []byte(`{"code":"touch /workspace/` + mark + `"` + extra + `}`)
	}
	mcpRun := func(t *testing.T, language, mark string) (int, string) {
		tr := &sdk.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: bearerTransport{key, http.DefaultTransport}}}
		cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctxT(t), tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		res, err := cs.CallTool(ctxT(t), &sdk.CallToolParams{Name: "run_code",
			Arguments: map[string]any{"sandbox_id": id, "language": language, "code": "touch /workspace/" + mark}})
		if err != nil {
			return 0, err.Error()
		}
		b, _ := json.Marshal(res.Content)
		if res.IsError {
			return 403, string(b)
		}
		return 200, string(b)
	}
	for _, tc := range []struct {
		name string
		try  func(t *testing.T, mark string) (int, string)
	}{
		{"rest cell language bash", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", api+"/code", authz, cell(m, `,"language":"bash"`))
		}},
		{"rest cell language sh", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", api+"/code", authz, cell(m, `,"language":"sh"`))
		}},
		{"rest cell language BASH", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", api+"/code", authz, cell(m, `,"language":"BASH"`))
		}},
		{"rest cell in a bash context, no language", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", api+"/code", authz, cell(m, `,"context_id":"`+restCtx+`"`))
		}},
		{"rest cell in a bash context, language python", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", api+"/code", authz, cell(m, `,"context_id":"`+restCtx+`","language":"python"`))
		}},
		{"rest cell in the E2B bash context", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", api+"/code", authz, cell(m, `,"context_id":"`+e2bCtx+`"`))
		}},
		{"rest new bash context", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", api+"/contexts", authz, []byte(`{"language":"bash","env":{"BASH_ENV":"/dev/null"}}`))
		}},
		{"rest new sh context", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", api+"/contexts", authz, []byte(`{"language":"sh"}`))
		}},
		{"e2b cell in a bash context", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", base+"/execute", interp, cell(m, `,"context_id":"`+e2bCtx+`"`))
		}},
		{"e2b cell language bash", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", base+"/execute", interp, cell(m, `,"language":"bash"`))
		}},
		{"e2b new bash context", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", base+"/contexts", interp, []byte(`{"language":"bash"}`))
		}},
		{"e2b process start bash", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", base+"/process.Process/Start", envd,
				e2b.AppendEnvelope(nil, 0, []byte(`{"process":{"cmd":"/bin/bash","args":["-l","-c","touch /home/user/`+m+`"]}}`)))
		}},
		{"e2b process start sh", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", base+"/process.Process/Start", envd,
				e2b.AppendEnvelope(nil, 0, []byte(`{"process":{"cmd":"sh","args":["-c","touch /home/user/`+m+`"]}}`)))
		}},
		{"e2b pty bash", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", base+"/process.Process/Start", envd,
				e2b.AppendEnvelope(nil, 0, []byte(`{"process":{"cmd":"/bin/bash","args":["-i","-l"]},"pty":{"size":{"cols":80,"rows":24}}}`)))
		}},
		{"rest exec shell", func(t *testing.T, m string) (int, string) {
			return send(t, "POST", api+"/exec", authz, []byte(`{"shell":"touch /workspace/`+m+`"}`))
		}},
		{"rest pty bash", func(t *testing.T, m string) (int, string) {
			return send(t, "GET", api+"/pty?cmd=bash&cmd=-c&cmd="+url.QueryEscape("touch /workspace/"+m), authz, nil)
		}},
		{"rest pty login shell", func(t *testing.T, m string) (int, string) {
			return send(t, "GET", api+"/pty", authz, nil)
		}},
		{"mcp run_code bash", func(t *testing.T, m string) (int, string) { return mcpRun(t, "bash", m) }},
		{"mcp run_code sh", func(t *testing.T, m string) (int, string) { return mcpRun(t, "sh", m) }},
	} {
		mark := strings.NewReplacer(" ", "-", ",", "").Replace(tc.name)
		t.Run(tc.name, func(t *testing.T) {
			st, body := tc.try(t, mark)
			if !strings.Contains(body, "no bash here") {
				t.Errorf("not refused by the policy: %d %s", st, body)
			}
			if st == 200 && !strings.Contains(body, "permission_denied") && !strings.Contains(body, "approval_denied") {
				t.Errorf("status %d for a refused action: %s", st, body)
			}
			if st, body := send(t, "GET", api+"/files/stat?path=/workspace/"+mark, authz, nil); st != 404 {
				t.Errorf("the refused code ran: %s is there (%d %s)", mark, st, body)
			}
		})
	}
	// Nothing new started: the contexts are the two made before the
	// policy, and python still runs.
	if st, body := send(t, "GET", api+"/contexts", authz, nil); st != 200 || strings.Count(body, `"language":"bash"`) != 2 {
		t.Fatalf("contexts: %d %s", st, body)
	}
	if st, body := send(t, "POST", api+"/code", authz, []byte(`{"code":"print(6*7)"}`)); st != 200 || !strings.Contains(body, "42") {
		t.Fatalf("a python cell: %d %s", st, body)
	}
}
