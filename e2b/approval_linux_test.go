package e2b

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/approval"
)

// TestApprovalHoldsE2BProcesses: a process started through the E2B
// surface is put to the same approval gate as the API's exec (through
// the manager's exec gate): a deny rule refuses it, an unanswered require
// rule times out, and neither runs.
func TestApprovalHoldsE2BProcesses(t *testing.T) {
	e := newEnvSetup(t, true, envSetup{Config: Config{Interpreter: AgentInterpreter{}}})
	pol, err := approval.Parse([]byte(`{"deny":[{"action":"exec","argv":"touch .*denied","reason":"no"}],
		"require":[{"action":"exec","argv":"touch .*held"}, {"action":"code"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	g, err := approval.New(approval.Config{Policy: pol, Timeout: time.Second, Audit: e.m.AuditFirst})
	if err != nil {
		t.Fatal(err)
	}
	e.m.SetExecGate(func(ctx context.Context, keyID, sandboxID, action string, detail map[string]any) error {
		return g.Check(ctx, approval.FromAudit(keyID, sandboxID, action, detail), nil)
	})
	var created sandboxCreated
	r := e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base"}`)
	if r.status != 201 {
		t.Fatalf("create: %d %q", r.status, r.body)
	}
	r.json(t, &created)
	id := created.SandboxID
	for file, code := range map[string]string{"denied": approval.CodeDenied, "held": approval.CodeTimeout} {
		_, rerr := e.stream(t, id, "process.Process/Start", `{"process":{"cmd":"/bin/touch","args":["/home/user/`+file+`"]}}`, nil)
		if rerr == nil || !strings.Contains(rerr.Message, code) {
			t.Fatalf("touch %s: %+v, want refused with %s", file, rerr, code)
		}
		e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"/home/user/`+file+`"}`, nil).rpcErr(t, CodeNotFound)
	}
	if _, rerr := e.stream(t, id, "process.Process/Start", `{"process":{"cmd":"/bin/touch","args":["/home/user/ok"]}}`, nil); rerr != nil {
		t.Fatalf("a command no rule names: %+v", rerr)
	}
	// A code cell (/execute) is held by the code rule: nobody answers,
	// it is refused and did not run.
	interp := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49999",
		"E2b-Traffic-Access-Token": created.TrafficAccessToken, "Content-Type": "application/json"}
	if r := e.do(t, "POST", "/execute", interp, []byte(`{"code":"open('/home/user/ran-code', 'w')"}`)); r.status == 200 || !strings.Contains(string(r.body), approval.CodeTimeout) {
		t.Fatalf("code cell: %d %s, want refused with %s", r.status, r.body, approval.CodeTimeout)
	}
	e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"/home/user/ran-code"}`, nil).rpcErr(t, CodeNotFound)
}
