package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/e2b"
	"github.com/airlock-dev/airlock/internal/pgtest"
	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/store"
)

// keyCall sends an API call with a bearer key and returns the status and
// body, failing t if api/openapi.yaml does not list the status.
func keyCall(t *testing.T, method, u, secret, body string) (int, string) {
	t.Helper()
	code, answer := tenantCall(t, method, u, "Authorization", secret, body)
	checkDocumented(t, method, u, code)
	return code, answer
}

// requestLines are the request-log lines of a JSON server log.
func requestLines(log string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

// createdKey is POST /v1/keys's answer.
type createdKey struct {
	Key       map[string]any
	Secret    string
	E2BSecret string `json:"e2b_secret"`
}

// createKeyCall creates a key through POST /v1/keys with an admin's
// secret, which must answer 201.
func createKeyCall(t *testing.T, base, admin, body string) (createdKey, string) {
	t.Helper()
	code, answer := keyCall(t, "POST", base+"/v1/keys", admin, body)
	if code != 201 {
		t.Fatalf("POST /v1/keys %s: %d %s", body, code, answer)
	}
	var k createdKey
	if err := json.Unmarshal([]byte(answer), &k); err != nil {
		t.Fatalf("POST /v1/keys answer %s: %v", answer, err)
	}
	return k, answer
}

// dashLogin logs a dashboard session in with secret and returns its
// cookie and CSRF token.
func dashLogin(t *testing.T, base, secret string) (cookie, csrf string) {
	t.Helper()
	code, body, resp := dashReq(t, "POST", base+"/ui/session", "", "x", base, `{"key":"`+secret+`"}`)
	if code != 200 {
		t.Fatalf("dashboard login: %d %s", code, body)
	}
	var sess struct{ CSRF string }
	json.Unmarshal([]byte(body), &sess)
	for _, c := range resp.Cookies() {
		if c.Name == "airlock_session" {
			cookie = c.Value
		}
	}
	if cookie == "" || sess.CSRF == "" {
		t.Fatalf("dashboard login: no session in %s", body)
	}
	return cookie, sess.CSRF
}

// TestKeysAdminAPI: only admin keys manage keys. A non-admin key cannot
// list, read, create (an admin or any key), revoke or re-limit keys, its own
// included, and each attempt is audited; an admin creates a key (its secret
// shown once, never again: no listing or read holds it), changes its limits
// (never its admin flag) and revokes it, which every surface refuses from
// the next request on: the native API, the E2B API (both key forms, and the
// envd access token of an E2B sandbox the key made), an MCP session opened
// before, and a dashboard session logged in before. The
// last live admin key cannot be revoked. Every admin action is in the audit
// log, and no response but the create's nor any log line holds a secret.
func TestKeysAdminAPI(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	adminSecret, adminID := keyWithID(t, "--name", "ops", "--admin", "--state-dir", state)
	userSecret, userID := keyWithID(t, "--name", "agent", "--state-dir", state, "--max-sandboxes", "1")
	s := startServer(t, state, "--log-format", "json")
	base := s.URL
	secrets := []string{adminSecret, userSecret}

	// A non-admin key: 403 everywhere under /v1/keys, nothing changes.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/keys", ""},
		{"GET", "/v1/keys/" + adminID, ""},
		{"GET", "/v1/keys/" + userID, ""},
		{"POST", "/v1/keys", `{"name":"mine","admin":true}`},
		{"POST", "/v1/keys", `{"name":"mine"}`},
		{"DELETE", "/v1/keys/" + adminID, ""},
		{"DELETE", "/v1/keys/" + userID, ""},
		{"PUT", "/v1/keys/" + userID + "/limits", `{"max_sandboxes":100}`},
	} {
		code, body := keyCall(t, c.method, base+c.path, userSecret, c.body)
		if code != 403 {
			t.Errorf("non-admin key: %s %s: %d %s, want 403", c.method, c.path, code, body)
		}
		if strings.Contains(body, "al_") {
			t.Errorf("non-admin key: %s %s answered a secret: %s", c.method, c.path, body)
		}
	}
	// The same through the user's dashboard session and the E2B header.
	ucookie, ucsrf := dashLogin(t, base, userSecret)
	if code, body, _ := dashReq(t, "GET", base+"/v1/keys", ucookie, ucsrf, base, ""); code != 403 {
		t.Errorf("non-admin dashboard session lists keys: %d %s", code, body)
	}
	// (an X-API-Key request is E2B's, which has no keys endpoint)
	if code, body := tenantCall(t, "GET", base+"/v1/keys", "X-API-Key", userSecret, ""); code == 200 || strings.Contains(body, adminID) {
		t.Errorf("X-API-Key on /v1/keys: %d %s", code, body)
	}

	// Admin: list shows both keys with their fields, and no secret.
	code, body := keyCall(t, "GET", base+"/v1/keys", adminSecret, "")
	if code != 200 {
		t.Fatalf("admin list: %d %s", code, body)
	}
	var list struct{ Keys []map[string]any }
	json.Unmarshal([]byte(body), &list)
	byID := map[string]map[string]any{}
	for _, k := range list.Keys {
		byID[k["id"].(string)] = k
	}
	if byID[adminID]["admin"] != true || byID[adminID]["last_used_at"] == nil || byID[userID]["admin"] != false || byID[userID]["max_sandboxes"] != 1.0 ||
		byID[userID]["name"] != "agent" || byID[userID]["created_at"] == nil || byID[userID]["limits"] == nil {
		t.Fatalf("admin list: %s", body)
	}
	// Create: the secret once; it works at once, and is not an admin.
	created, body := createKeyCall(t, base, adminSecret, `{"name":"ci","max_sandboxes":2,"limits":{"pids":64}}`)
	newID, _ := created.Key["id"].(string)
	if !strings.HasPrefix(created.Secret, "al_") || !strings.HasPrefix(created.E2BSecret, "e2b_") || newID == "" || created.Key["admin"] != false {
		t.Fatalf("create answer: %s", body)
	}
	secrets = append(secrets, created.Secret, created.E2BSecret)
	for _, p := range []string{"/v1/keys", "/v1/keys/" + newID, "/v1/keys/" + adminID} {
		code, body := keyCall(t, "GET", base+p, adminSecret, "")
		if code != 200 {
			t.Fatalf("admin GET %s: %d %s", p, code, body)
		}
		for _, sec := range secrets {
			if strings.Contains(body, sec) || strings.Contains(body, strings.TrimPrefix(sec, "al_")) {
				t.Errorf("GET %s holds a secret: %s", p, body)
			}
		}
	}
	if code, body := keyCall(t, "GET", base+"/v1/keys", created.Secret, ""); code != 403 {
		t.Errorf("a key an admin made lists keys: %d %s", code, body)
	}
	// No escalation: the limits call takes no admin flag, from anyone.
	for _, sec := range []string{adminSecret, created.Secret} {
		if code, body := keyCall(t, "PUT", base+"/v1/keys/"+newID+"/limits", sec, `{"max_sandboxes":2,"admin":true}`); code != 400 && code != 403 {
			t.Errorf("PUT limits with admin:true: %d %s", code, body)
		}
	}
	// Limits: replaced whole, and shown.
	code, body = keyCall(t, "PUT", base+"/v1/keys/"+newID+"/limits", adminSecret, `{"max_sandboxes":3,"limits":{"memory_bytes":2147483648,"timeout_s":600}}`)
	if code != 200 || !strings.Contains(body, `"max_sandboxes":3`) || !strings.Contains(body, `"memory_bytes":2147483648`) ||
		strings.Contains(body, `"pids"`) || !strings.Contains(body, `"admin":false`) {
		t.Fatalf("PUT limits: %d %s", code, body)
	}
	if code, body := keyCall(t, "PUT", base+"/v1/keys/"+newID+"/limits", adminSecret, `{"limits":{"pids":-1}}`); code != 400 {
		t.Errorf("negative limit: %d %s", code, body)
	}

	// The new key on every surface, before its revocation.
	ctx := ctxT(t)
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "revoke", Version: "1"}, nil).Connect(ctx,
		&sdk.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: mcpBearer{created.Secret}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "list_sandboxes"}); err != nil || res.IsError {
		t.Fatalf("MCP list_sandboxes before revocation: %v %v", err, res)
	}
	ncookie, ncsrf := dashLogin(t, base, created.Secret)
	// An E2B sandbox of the key: its envd access token stands for the key.
	code, sbody := send(t, "POST", base+"/v2/sandboxes", map[string]string{"X-API-Key": created.E2BSecret, "Content-Type": "application/json"},
		[]byte(`{"templateID":"base","timeout":600}`))
	var e2bBox struct{ SandboxID, EnvdAccessToken string }
	if code != 201 || json.Unmarshal([]byte(sbody), &e2bBox) != nil || e2bBox.EnvdAccessToken == "" {
		t.Fatalf("E2B create: %d %s", code, sbody)
	}
	envd := map[string]string{"E2b-Sandbox-Id": e2bBox.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": e2bBox.EnvdAccessToken}
	surfaces := func() map[string]int {
		out := map[string]int{}
		if code, _ := send(t, "GET", base+"/health", envd, nil); code/100 == 2 {
			out["e2b envd"] = 200
		} else {
			out["e2b envd"] = code
		}
		out["native"], _ = keyCall(t, "GET", base+"/v1/sandboxes", created.Secret, "")
		out["e2b"], _ = tenantCall(t, "GET", base+"/sandboxes", "X-API-Key", created.Secret, "")
		out["e2b form"], _ = tenantCall(t, "GET", base+"/sandboxes", "X-API-Key", created.E2BSecret, "")
		out["dashboard"], _, _ = dashReq(t, "GET", base+"/v1/sandboxes", ncookie, ncsrf, base, "")
		return out
	}
	for surface, code := range surfaces() {
		if code != 200 {
			t.Fatalf("new key on %s before revocation: %d", surface, code)
		}
	}
	code, body = keyCall(t, "DELETE", base+"/v1/keys/"+newID, adminSecret, "")
	if code != 200 || !strings.Contains(body, `"revoked_at"`) {
		t.Fatalf("revoke: %d %s", code, body)
	}
	// From the very next request on: no waiting, no polling.
	for surface, code := range surfaces() {
		if code != 401 {
			t.Errorf("revoked key on %s: %d, want 401", surface, code)
		}
	}
	if _, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "list_sandboxes"}); err == nil {
		t.Error("an MCP session of a revoked key still calls tools")
	}
	if _, body, _ := dashReq(t, "GET", base+"/ui/session", ncookie, "", "", ""); !strings.Contains(body, `"authenticated":false`) {
		t.Errorf("a revoked key's dashboard session is still logged in: %s", body)
	}
	if code, body := keyCall(t, "PUT", base+"/v1/keys/"+newID+"/limits", adminSecret, `{"max_sandboxes":1}`); code != 409 {
		t.Errorf("limits of a revoked key: %d %s", code, body)
	}

	// The last admin key: refused, and it keeps working.
	if code, body := keyCall(t, "DELETE", base+"/v1/keys/"+adminID, adminSecret, ""); code != 409 {
		t.Fatalf("revoking the last admin key: %d %s", code, body)
	}
	if code, body := keyCall(t, "GET", base+"/v1/keys", adminSecret, ""); code != 200 {
		t.Fatalf("the last admin key after a refused revocation: %d %s", code, body)
	}
	// An admin may make another admin; then the first can go.
	admin2, _ := createKeyCall(t, base, adminSecret, `{"name":"ops2","admin":true}`)
	secrets = append(secrets, admin2.Secret, admin2.E2BSecret)
	admin2ID, _ := admin2.Key["id"].(string)
	if code, body := keyCall(t, "DELETE", base+"/v1/keys/"+adminID, admin2.Secret, ""); code != 200 {
		t.Fatalf("second admin revokes the first: %d %s", code, body)
	}
	if code, _ := keyCall(t, "GET", base+"/v1/keys", adminSecret, ""); code != 401 {
		t.Errorf("revoked admin key: %d, want 401", code)
	}
	s.stop(t)

	// The audit log names every admin action and each refused attempt,
	// with no secret.
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs, err := st.AuditLog(context.Background(), store.AuditFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, ev := range evs {
		if !strings.HasPrefix(ev.Action, "key.") {
			continue
		}
		count[ev.Action+" by "+ev.KeyID]++
		for _, sec := range secrets {
			if strings.Contains(string(ev.Detail), sec) {
				t.Errorf("audit record %s holds a secret", ev.Action)
			}
		}
	}
	for what, n := range map[string]int{
		"key.denied by " + userID:   9, // eight bearer calls and the dashboard's
		"key.create by " + adminID:  2,
		"key.limits by " + adminID:  1,
		"key.revoke by " + adminID:  1,
		"key.revoke by " + admin2ID: 1,
		"key.denied by " + newID:    2, // its list and its limits call
	} {
		if count[what] != n {
			t.Errorf("audit: %d × %s, want %d (all: %v)", count[what], what, n, count)
		}
	}

	// The request log: key ids on /v1/keys lines, no secret anywhere.
	log := s.ReadLog()
	for _, sec := range secrets {
		if strings.Contains(log, sec) || strings.Contains(log, strings.TrimPrefix(sec, "al_")) {
			t.Errorf("the server log holds a secret")
		}
	}
	seen := false
	for _, m := range requestLines(log) {
		if m["route"] == "POST /v1/keys" && m["status"] == 201.0 && m["key_id"] == adminID {
			seen = true
		}
	}
	if !seen {
		t.Errorf("no request line for the admin's create with its key id:\n%s", log)
	}
}

// TestE2BRequestLogKeyID: an E2B control-plane call authenticated with
// X-API-Key (either form of the key) logs the key's id, like a native
// call, and never the key.
func TestE2BRequestLogKeyID(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	secret, id := keyWithID(t, "--name", "e2b", "--state-dir", state)
	s := startServer(t, state, "--log-format", "json")
	e2bForm, err := e2b.E2BKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range []string{secret, e2bForm} {
		for _, hdr := range []string{"X-API-Key", "Authorization"} {
			if code, body := tenantCall(t, "GET", s.URL+"/sandboxes", hdr, sec, ""); code != 200 {
				t.Fatalf("E2B list with %s: %d %s", hdr, code, body)
			}
		}
	}
	code, body := keyCall(t, "GET", s.URL+"/v1/sandboxes", secret, "")
	if code != 200 {
		t.Fatalf("native list: %d %s", code, body)
	}
	s.stop(t)
	log := s.ReadLog()
	if strings.Contains(log, secret) || strings.Contains(log, strings.TrimPrefix(secret, "al_")) || strings.Contains(log, strings.TrimPrefix(e2bForm, "e2b_")) {
		t.Fatal("the server log holds the key")
	}
	found := map[string]bool{}
	for _, m := range requestLines(log) {
		if m["key_id"] == id {
			found[m["route"].(string)] = true
		}
	}
	if !found["e2b GET /sandboxes"] || !found["GET /v1/sandboxes"] {
		t.Fatalf("request lines with key_id %s: %v\n%s", id, found, log)
	}
}

// TestRevokedKeyCutsOpenStreams: requests of a key that are already
// running when it is revoked end too: a streamed exec and a terminal
// (PTY WebSocket) end at once when an admin revokes the key through the
// server, and a streamed exec ends within seconds when the key is revoked
// by the CLI on the state directory (another process). The sandboxes'
// commands are the key's business: only the requests are cut.
func TestRevokedKeyCutsOpenStreams(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	adminSecret, _ := keyWithID(t, "--name", "ops", "--admin", "--state-dir", state)
	otherSecret, otherID := keyWithID(t, "--name", "cli-revoked", "--state-dir", state)
	s := startServer(t, state)
	ctx := ctxT(t)
	admin := client.New(s.URL, adminSecret)
	made, err := admin.CreateKey(ctx, client.CreateKeyRequest{Name: "streamer"})
	if err != nil {
		t.Fatal(err)
	}

	// ended reports (on done) when next returns an error.
	ended := func(next func() error) <-chan error {
		done := make(chan error, 1)
		go func() {
			for {
				if err := next(); err != nil {
					done <- err
					return
				}
			}
		}()
		return done
	}
	open := func(secret string) (exec, term <-chan error) {
		c := client.New(s.URL, secret)
		sb, err := c.Create(ctx, client.CreateRequest{Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.ExecStream(ctx, sb.ID, client.ExecRequest{Shell: "echo up; sleep 600", Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if ev, err := st.Next(); err != nil || ev.Type != "start" {
			t.Fatalf("exec stream: %+v %v", ev, err)
		}
		tm, err := c.Terminal(ctx, sb.ID, client.TerminalRequest{Argv: []string{"sleep", "600"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tm.Close() })
		buf := make([]byte, 256)
		return ended(func() error { _, err := st.Next(); return err }), ended(func() error { _, err := tm.Read(buf); return err })
	}
	const deadline = 60 * time.Second
	wait := func(what string, ch <-chan error) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(deadline):
			t.Fatalf("%s still open %s after its key was revoked", what, deadline)
		}
	}

	execA, termA := open(made.Secret)
	select {
	case err := <-execA:
		t.Fatalf("the exec stream ended before the revocation: %v", err)
	case err := <-termA:
		t.Fatalf("the terminal ended before the revocation: %v", err)
	case <-time.After(3 * time.Second): // past a re-check: the live key keeps them
	}
	if _, err := admin.RevokeKey(ctx, made.Key.ID); err != nil {
		t.Fatal(err)
	}
	wait("a streamed exec", execA)
	wait("a terminal", termA)

	execB, termB := open(otherSecret)
	if out, err := exec.Command(airlockBin(t), "keys", "revoke", "--state-dir", state, otherID).CombinedOutput(); err != nil {
		t.Fatalf("keys revoke: %v %s", err, out)
	}
	wait("a streamed exec (CLI revocation)", execB)
	wait("a terminal (CLI revocation)", termB)
}

// TestKeysFullDisk: with the state directory's file system full, key
// changes fail closed: a create answers no secret and leaves no live key,
// a limits change is refused and changes nothing, and a revocation either
// happens (and is audited once there is room) or is refused and the key
// stays as it was; once there is room again, all of them work.
func TestKeysFullDisk(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	testserver.MountTmpfs(t, state, "24m")
	adminSecret, _ := keyWithID(t, "--name", "ops", "--admin", "--state-dir", state)
	s := startServer(t, state)
	base := s.URL
	victim, _ := createKeyCall(t, base, adminSecret, `{"name":"victim","max_sandboxes":2}`)
	victimID := victim.Key["id"].(string)
	filler := testserver.FillDisk(t, state)

	code, body := keyCall(t, "POST", base+"/v1/keys", adminSecret, `{"name":"during-full"}`)
	if code < 500 || strings.Contains(body, "al_") || strings.Contains(body, "e2b_") {
		t.Fatalf("create on a full disk: %d %s", code, body)
	}
	if code, body := keyCall(t, "PUT", base+"/v1/keys/"+victimID+"/limits", adminSecret, `{"max_sandboxes":9}`); code < 500 {
		t.Fatalf("limits on a full disk: %d %s", code, body)
	}
	revCode, revBody := keyCall(t, "DELETE", base+"/v1/keys/"+victimID, adminSecret, "")
	if revCode != 200 && revCode < 500 {
		t.Fatalf("revoke on a full disk: %d %s", revCode, revBody)
	}
	t.Logf("on a full disk: create %d, revoke %d %s", code, revCode, revBody)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}

	admin := client.New(base, adminSecret)
	ctx := ctxT(t)
	k, err := keyByID(ctx, admin, victimID)
	if err != nil {
		t.Fatal(err)
	}
	if k.MaxSandboxes != 2 {
		t.Errorf("a limits change refused on a full disk happened: %+v", k)
	}
	if (revCode == 200) != (k.RevokedAt != nil) {
		t.Fatalf("revoke answered %d on a full disk, and the key is %+v", revCode, k)
	}
	keys, err := admin.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.Name == "during-full" && k.RevokedAt == nil {
			t.Fatalf("a create refused on a full disk left a live key: %+v", k)
		}
	}
	if revCode != 200 {
		if _, err := admin.RevokeKey(ctx, victimID); err != nil {
			t.Fatalf("revoke once there is room: %v", err)
		}
	}
	// The revocation's record reaches the log (retried until written).
	eventually(t, 60*time.Second, "the key.revoke record", func() bool {
		_, body := keyCall(t, "GET", base+"/v1/audit?action=key.revoke", adminSecret, "")
		return strings.Contains(body, victimID)
	})
	if _, err := admin.CreateKey(ctx, client.CreateKeyRequest{Name: "after-full"}); err != nil {
		t.Fatalf("create once there is room: %v", err)
	}
}

// TestKeysAdminSharedDatabase: two servers on one PostgreSQL database. A
// key an admin makes through one works on the other; revoked through one,
// the other refuses it at its next request and cuts its running stream;
// two admins revoking each other through the two servers at once cannot
// both succeed (exactly one live admin stays).
func TestKeysAdminSharedDatabase(t *testing.T) {
	needRoot(t)
	dbURL := pgtest.Shared(t).NewDatabase(t)
	stateA, stateB := stateDir(t), stateDir(t)
	adminSecret, adminID := keyWithID(t, "--name", "ops", "--admin", "--state-dir", stateA, "--database-url", dbURL)
	a := startServer(t, stateA, "--database-url", dbURL)
	b := startServer(t, stateB, "--database-url", dbURL)
	ctx := ctxT(t)

	made, _ := createKeyCall(t, a.URL, adminSecret, `{"name":"shared"}`)
	id := made.Key["id"].(string)
	cb := client.New(b.URL, made.Secret)
	sb, err := cb.Create(ctx, client.CreateRequest{Timeout: 600})
	if err != nil {
		t.Fatalf("a key made through one server, on the other: %v", err)
	}
	st, err := cb.ExecStream(ctx, sb.ID, client.ExecRequest{Shell: "sleep 600", Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if ev, err := st.Next(); err != nil || ev.Type != "start" {
		t.Fatalf("exec stream: %+v %v", ev, err)
	}
	streamEnded := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Next(); err != nil {
				streamEnded <- err
				return
			}
		}
	}()
	if code, body := keyCall(t, "DELETE", a.URL+"/v1/keys/"+id, adminSecret, ""); code != 200 {
		t.Fatalf("revoke through A: %d %s", code, body)
	}
	if code, _ := keyCall(t, "GET", b.URL+"/v1/sandboxes", made.Secret, ""); code != 401 {
		t.Fatalf("B after the revocation through A: %d, want 401", code)
	}
	select {
	case <-streamEnded:
	case <-time.After(60 * time.Second):
		t.Fatal("B's stream of a key revoked through A is still open after 60 s")
	}

	admin2, _ := createKeyCall(t, b.URL, adminSecret, `{"name":"ops2","admin":true}`)
	admin2ID := admin2.Key["id"].(string)
	codes := make(chan int, 2)
	revoke := func(base, secret, id string) {
		_, err := client.New(base, secret).RevokeKey(ctx, id)
		codes <- map[bool]int{true: 200, false: client.StatusOf(err)}[err == nil]
	}
	go revoke(a.URL, admin2.Secret, adminID)
	go revoke(b.URL, adminSecret, admin2ID)
	c1, c2 := <-codes, <-codes
	// The loser is refused by the guard (409), or, if the winner's
	// revocation came first, as a revoked key (401).
	if c1 != 200 {
		c1, c2 = c2, c1
	}
	if c1 != 200 || c2 != 409 && c2 != 401 {
		t.Fatalf("two admins revoking each other through two servers: %d and %d, want one 200", c1, c2)
	}
	live := 0
	for _, sec := range []string{adminSecret, admin2.Secret} {
		keys, err := client.New(a.URL, sec).Keys(ctx)
		if err != nil {
			continue // the revoked one
		}
		for _, k := range keys {
			if k.Admin && k.RevokedAt == nil {
				live++
			}
		}
	}
	if live != 1 {
		t.Fatalf("%d live admin keys after two admins revoked each other, want 1", live)
	}
}
