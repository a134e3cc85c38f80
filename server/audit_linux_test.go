package server_test

import (
	"encoding/json"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

type auditPage struct {
	Events []struct {
		ID        int64
		KeyID     string `json:"key_id"`
		SandboxID string `json:"sandbox_id"`
		Action    string
		Detail    json.RawMessage
	}
	Next int64
}

// TestE2EAuditLog: GET /v1/audit shows a key its own events (filters,
// paging), never another key's; `airlock audit` shows everything from
// the state directory.
func TestE2EAuditLog(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	alice := newKey(t, state, "alice")
	bob := newKey(t, state, "bob")
	s := startServer(t, state)
	ca, cb := client.New(s.URL, alice), client.New(s.URL, bob)
	ctx := ctxT(t)
	sa, err := ca.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	sbob, err := cb.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		c  *client.Client
		id string
	}{{ca, sa.ID}, {cb, sbob.ID}} {
		if _, err := c.c.Exec(ctx, c.id, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(key string, q url.Values) auditPage {
		t.Helper()
		st, _, body := raw(t, "GET", s.URL+"/v1/audit?"+q.Encode(), key, nil)
		var p auditPage
		if st != 200 || json.Unmarshal(body, &p) != nil {
			t.Fatalf("GET /v1/audit?%s: %d %s", q.Encode(), st, body)
		}
		return p
	}
	all := get(alice, nil)
	actions := map[string]bool{}
	for _, e := range all.Events {
		if e.SandboxID != sa.ID {
			t.Fatalf("alice sees an event about %s: %+v", e.SandboxID, e)
		}
		actions[e.Action] = true
	}
	if !actions["sandbox.create"] || !actions["exec"] || !actions["exec.result"] {
		t.Fatalf("alice's audit log: %+v", all.Events)
	}
	if p := get(alice, url.Values{"sandbox": {sbob.ID}}); len(p.Events) != 0 {
		t.Fatalf("alice reads bob's sandbox's events: %+v", p.Events)
	}
	if p := get(alice, url.Values{"action": {"exec"}}); len(p.Events) != 1 || !strings.Contains(string(p.Events[0].Detail), `"true"`) {
		t.Fatalf("action=exec: %+v", p.Events)
	}
	if p := get(alice, url.Values{"since": {time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}}); len(p.Events) != 0 {
		t.Fatalf("since an hour from now: %+v", p.Events)
	}
	first := get(alice, url.Values{"limit": {"1"}})
	if len(first.Events) != 1 || first.Next != first.Events[0].ID {
		t.Fatalf("limit=1: %+v", first)
	}
	second := get(alice, url.Values{"limit": {"1"}, "before": {strconv.FormatInt(first.Next, 10)}})
	if len(second.Events) != 1 || second.Events[0].ID >= first.Events[0].ID {
		t.Fatalf("second page: %+v after %+v", second, first)
	}
	for _, q := range []string{"bogus=1", "since=yesterday", "limit=0", "before=x"} {
		if st, _, body := raw(t, "GET", s.URL+"/v1/audit?"+q, alice, nil); st != 400 {
			t.Errorf("GET /v1/audit?%s: %d %s", q, st, body)
		}
	}
	if st, _, _ := raw(t, "GET", s.URL+"/v1/audit", "", nil); st != 401 {
		t.Errorf("GET /v1/audit without a key: %d", st)
	}

	// The CLI reads the state directory: every key's events.
	out, err := exec.Command(airlockBin(t), "audit", "--state-dir", state, "--action", "exec", "--json").Output()
	var p auditPage
	if err != nil || json.Unmarshal(out, &p) != nil || len(p.Events) != 2 {
		t.Fatalf("airlock audit --json: %v %s", err, out)
	}
	out, err = exec.Command(airlockBin(t), "audit", "--state-dir", state, "--sandbox", sbob.ID).Output()
	if err != nil || !strings.Contains(string(out), "sandbox.create") || strings.Contains(string(out), sa.ID) {
		t.Fatalf("airlock audit --sandbox: %v %s", err, out)
	}
	if out, err := exec.Command(airlockBin(t), "audit", "--state-dir", state, "--since", "soon").CombinedOutput(); err == nil || !strings.Contains(string(out), "RFC 3339") {
		t.Fatalf("airlock audit --since soon: %v %s", err, out)
	}
}
