package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// TestKeysServerMode: airlock keys drives a running server's /v1/keys with
// an admin key ($AIRLOCK_URL and $AIRLOCK_API_KEY, or --url and
// --api-key): create (the secret printed once, and working), list (no
// secret), limits, revoke; a non-admin key is refused and changes nothing;
// the last admin key is kept; --state-dir still means the local store.
func TestKeysServerMode(t *testing.T) {
	testserver.NeedRoot(t)
	state := testserver.StateDir(t)
	adminKey := testserver.NewKey(t, state, "ops", "--admin")
	userKey := testserver.NewKey(t, state, "agent")
	srv := testserver.Start(t, state)
	admin := remoteCLI{t: t, env: []string{"AIRLOCK_URL=" + srv.URL, "AIRLOCK_API_KEY=" + adminKey}, dir: t.TempDir()}
	user := remoteCLI{t: t, env: []string{"AIRLOCK_URL=" + srv.URL, "AIRLOCK_API_KEY=" + userKey}, dir: t.TempDir()}

	out, errOut, code := admin.run("", "keys", "create", "--name", "ci", "--max-sandboxes", "2", "--max-pids", "64")
	id := regexp.MustCompile(`created key (key_[0-9a-f]+)`).FindStringSubmatch(errOut)
	secret := strings.TrimSpace(out)
	if code != 0 || id == nil || !strings.HasPrefix(secret, "al_") {
		t.Fatalf("server-mode create: %d %q %q", code, out, errOut)
	}
	if _, err := client.New(srv.URL, secret).List(t.Context(), nil); err != nil {
		t.Fatalf("a key made through the server: %v", err)
	}
	out = admin.must("", "keys", "list")
	if !regexp.MustCompile(id[1]+`\s+ci\s+\S+\s+2\s+-\s+pids 64\s+no`).MatchString(out) || !regexp.MustCompile(`ops\s.*\syes\s+20\d\d-\S+\n`).MatchString(out) {
		t.Fatalf("server-mode list:\n%s", out)
	}
	for _, s := range []string{secret, adminKey, userKey} {
		if strings.Contains(out, s) {
			t.Fatalf("list shows a secret:\n%s", out)
		}
	}
	// --url and --api-key work too, and limits replaces the whole set.
	bare := remoteCLI{t: t, dir: t.TempDir()}
	if _, errOut, code := bare.run("", "keys", "limits", "--url", srv.URL, "--api-key", adminKey, "--max-memory", "256M", id[1]); code != 0 ||
		!strings.Contains(errOut, "max sandboxes 0, limits memory 256M") {
		t.Fatalf("server-mode limits: %d %q", code, errOut)
	}

	// A non-admin key: refused, nothing changes.
	for _, args := range [][]string{{"keys", "list"}, {"keys", "create", "--name", "x", "--admin"}, {"keys", "revoke", id[1]},
		{"keys", "limits", "--max-sandboxes", "99", id[1]}} {
		if _, errOut, code := user.run("", args...); code == 0 || !strings.Contains(errOut, "admin") {
			t.Errorf("non-admin %v: %d %q", args, code, errOut)
		}
	}
	if _, errOut, code := admin.run("", "keys", "revoke", id[1]); code != 0 {
		t.Fatalf("server-mode revoke: %d %q", code, errOut)
	}
	if _, err := client.New(srv.URL, secret).List(t.Context(), nil); err == nil {
		t.Fatal("a revoked key still works")
	}
	adminID := regexp.MustCompile(`(key_[0-9a-f]+)\s+ops\s`).FindStringSubmatch(admin.must("", "keys", "list"))
	if _, errOut, code := admin.run("", "keys", "revoke", adminID[1]); code == 0 || !strings.Contains(errOut, "last live admin key") {
		t.Fatalf("revoking the last admin: %d %q", code, errOut)
	}
	// --state-dir wins over $AIRLOCK_URL: the local store.
	if out, errOut, code := admin.run("", "keys", "list", "--state-dir", state); code != 0 || !strings.Contains(out, "ci") {
		t.Fatalf("local list with $AIRLOCK_URL set: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := admin.run("", "keys", "create", "--name", "p", "--approval-policy", "/dev/null"); code != exitUsage ||
		!strings.Contains(errOut, "need --state-dir") {
		t.Fatalf("--approval-policy in server mode: %d %q", code, errOut)
	}
	if _, errOut, code := bare.run("", "keys", "list"); code != exitUsage || !strings.Contains(errOut, "--state-dir DIR") {
		t.Fatalf("neither --state-dir nor a URL: %d %q", code, errOut)
	}
}
