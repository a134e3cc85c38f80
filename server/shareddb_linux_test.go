package server_test

import (
	"encoding/json"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/pgtest"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// keyWithID creates a key with `airlock keys create ARGS...` and returns
// its secret and id.
func keyWithID(t *testing.T, args ...string) (secret, id string) {
	t.Helper()
	cmd := exec.Command(airlockBin(t), append([]string{"keys", "create"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("keys create: %v\n%s", err, stderr.String())
	}
	m := regexp.MustCompile(`created key (key_[0-9a-f]+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("keys create said %q", stderr.String())
	}
	return strings.TrimSpace(string(out)), m[1]
}

// TestE2ESharedDatabase: two `airlock serve` replicas on one PostgreSQL
// database (one given --database-url, the other $AIRLOCK_DATABASE_URL)
// share keys and the audit log: a key made on one's state directory works
// on both, with its approval policy, a revocation through one is refused by both at once, and both
// servers' events are in one log in order. With PostgreSQL down, requests
// are refused (fail closed: 503 key_store_unavailable; an unauthenticated
// server's exec is refused with audit_unavailable and does not run, checked
// in the host's /proc), and both work again once it is back. The password
// shows in no log.
func TestE2ESharedDatabase(t *testing.T) {
	needRoot(t)
	pg := pgtest.Shared(t)
	dbURL := pg.NewDatabase(t)
	stateA, stateB, stateC := stateDir(t), stateDir(t), stateDir(t)
	a := startServer(t, stateA, "--database-url", dbURL)
	t.Setenv("AIRLOCK_DATABASE_URL", dbURL)
	b := startServer(t, stateB)
	// An unauthenticated server: its requests reach the audit write even
	// with the key store down, which shows AuditFirst failing closed.
	c := startServer(t, stateC, "--no-auth")
	ctx := ctxT(t)

	keyPol := writePolicy(t, `{"deny":[{"action":"exec","argv":"^pip install","reason":"no installs"}]}`)
	secret, keyID := keyWithID(t, "--name", "shared", "--state-dir", stateA, "--approval-policy", keyPol)
	other, otherID := keyWithID(t, "--name", "other", "--state-dir", stateB, "--database-url", dbURL)
	ca, cb := client.New(a.URL, secret), client.New(b.URL, secret)
	for _, cl := range []*client.Client{ca, cb, client.New(a.URL, other), client.New(b.URL, other)} {
		if _, err := cl.List(ctx, nil); err != nil {
			t.Fatalf("a key made on one replica's state directory, used on either: %v", err)
		}
	}

	// One log, in order, from both servers.
	sa, err := ca.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := cb.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		cl *client.Client
		id string
	}{{ca, sa.ID}, {cb, sb.ID}, {ca, sa.ID}}
	for i, s := range steps {
		if _, err := s.cl.Exec(ctx, s.id, client.ExecRequest{Argv: []string{"echo", "step", string(rune('0' + i))}}); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for i, s := range steps {
		want = append(want, s.id+" step "+string(rune('0'+i)))
	}
	for _, srvURL := range []string{a.URL, b.URL} {
		st, _, body := raw(t, "GET", srvURL+"/v1/audit?action=exec", secret, nil)
		var p auditPage
		if st != 200 || json.Unmarshal(body, &p) != nil {
			t.Fatalf("GET %s/v1/audit: %d %s", srvURL, st, body)
		}
		var got []string
		for i := len(p.Events) - 1; i >= 0; i-- { // oldest first
			e := p.Events[i]
			var d struct{ Argv []string }
			json.Unmarshal(e.Detail, &d)
			got = append(got, e.SandboxID+" "+strings.Join(d.Argv[1:], " "))
			if e.KeyID != keyID {
				t.Errorf("event by %q, want %s: %+v", e.KeyID, keyID, e)
			}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("exec events on %s = %q, want %q", srvURL, got, want)
		}
	}

	// `airlock audit` on either state directory shows the one log.
	out, err := exec.Command(airlockBin(t), "audit", "--state-dir", stateC, "--action", "exec", "--json").Output()
	var p auditPage
	if err != nil || json.Unmarshal(out, &p) != nil || len(p.Events) != len(steps) ||
		p.Events[0].SandboxID != sa.ID || p.Events[1].SandboxID != sb.ID {
		t.Errorf("airlock audit with $AIRLOCK_DATABASE_URL: %v %s", err, out)
	}

	// The key's approval policy, given on A's state directory, holds on B.
	_, err = cb.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"pip", "install", "requests"}})
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != approval.CodeDenied || !strings.Contains(ae.Message, "no installs") {
		t.Errorf("the key's approval policy on the other replica: %v, want %s", err, approval.CodeDenied)
	}

	// Revoked through one replica's CLI: refused by both from the next request.
	out, err = exec.Command(airlockBin(t), "keys", "revoke", "--state-dir", stateB, otherID).CombinedOutput()
	if err != nil {
		t.Fatalf("keys revoke: %v\n%s", err, out)
	}
	for _, u := range []string{a.URL, b.URL} {
		if st, _, body := raw(t, "GET", u+"/v1/sandboxes", other, nil); st != 401 {
			t.Errorf("revoked key on %s: %d %s, want 401", u, st, body)
		}
	}

	// Its sandbox has rules of its own (kept in the database, and in the
	// memory of the server that created it), so that with the database
	// down the exec below gets past the approval gate to the audit write.
	cc := client.New(c.URL, "")
	st, _, body := raw(t, "POST", c.URL+"/v1/sandboxes", "",
		strings.NewReader(`{"timeout":600,"approval":{"deny":[{"action":"exec","argv":"^never-run","reason":"test"}]}}`))
	var sc client.Sandbox
	if st != 201 || json.Unmarshal(body, &sc) != nil {
		t.Fatalf("create on the unauthenticated server: %d %s", st, body)
	}

	// PostgreSQL down: fail closed.
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Resume() })
	for _, u := range []string{a.URL, b.URL} {
		st, _, body := raw(t, "POST", u+"/v1/sandboxes/"+sa.ID+"/exec", secret, strings.NewReader(`{"argv":["true"]}`))
		if st != 503 || !strings.Contains(string(body), "key_store_unavailable") {
			t.Errorf("exec on %s with PostgreSQL down: %d %s, want 503 key_store_unavailable", u, st, body)
		}
	}
	const marker = "4242.31337"
	_, err = cc.Start(ctx, sc.ID, client.ExecRequest{Argv: []string{"sleep", marker}, Background: true})
	if !errors.As(err, &ae) || ae.Status != 503 || ae.Code != "audit_unavailable" {
		t.Errorf("exec with the audit log down = %v, want 503 audit_unavailable", err)
	}
	if testserver.HostRuns("sleep\x00" + marker + "\x00") {
		t.Error("the refused command runs on the host")
	}

	// Back: both replicas work again (a connection the restart broke may
	// fail one request).
	if err := pg.Resume(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		cl *client.Client
		id string
	}{{ca, sa.ID}, {cb, sb.ID}, {cc, sc.ID}} {
		eventually(t, 30*time.Second, "exec after PostgreSQL is back", func() bool {
			_, err := s.cl.Exec(ctx, s.id, client.ExecRequest{Argv: []string{"true"}})
			if err != nil {
				t.Logf("exec after PostgreSQL is back: %v", err)
			}
			return err == nil
		})
	}
	for _, s := range []*srv{a, b, c} {
		if log := s.ReadLog(); strings.Contains(log, pg.Password()) {
			t.Errorf("the database password is in the log of %s:\n%s", s.URL, log)
		} else if !strings.Contains(log, "postgres://postgres:xxxxx@127.0.0.1") {
			t.Errorf("%s does not log which database it uses:\n%s", s.URL, log)
		}
	}
}
