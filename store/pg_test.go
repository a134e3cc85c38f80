package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-dev/airlock/internal/pgtest"
)

// Two servers (two stores on two state directories) sharing one PostgreSQL
// database: a key made through one authenticates through the other, and a
// revocation through either, or straight in the database, is refused by
// both at once (no per-server cache).
func TestPGRevokeSeenByEveryServer(t *testing.T) {
	b := backend{name: "postgres", url: pgtest.Shared(t).NewDatabase(t)}
	a, _ := b.openTest(t)
	other, _ := b.openTest(t)
	ctx := context.Background()
	key, secret, err := a.CreateKey(ctx, "shared", 2)
	if err != nil {
		t.Fatal(err)
	}
	key2, secret2, err := other.CreateKey(ctx, "shared2", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Store{a, other} {
		for _, sec := range []string{secret, secret2} {
			if _, err := s.Authenticate(ctx, sec); err != nil {
				t.Fatalf("key made on one server, authenticated on either: %v", err)
			}
		}
	}
	if err := a.RevokeKey(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Authenticate(ctx, secret); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("key revoked on one server still authenticates on the other: %v", err)
	}
	if err := rawExec(t, a.kw, `UPDATE api_keys SET revoked_at = 1 WHERE id = $1`, key2.ID); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Store{a, other} {
		if _, err := s.Authenticate(ctx, secret2); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("key revoked in the database still authenticates: %v", err)
		}
	}
	if keys, err := other.ListKeys(ctx); err != nil || len(keys) != 2 {
		t.Errorf("ListKeys on the other server = %v, %v", keys, err)
	}
}

// Servers starting at once on a new database each migrate it safely: the
// advisory lock makes one apply the schema and the others find it done.
func TestPGConcurrentMigration(t *testing.T) {
	b := backend{name: "postgres", url: pgtest.Shared(t).NewDatabase(t)}
	const n = 4
	var wg sync.WaitGroup
	stores := make([]*Store, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { stores[i], errs[i] = b.open(filepath.Join(t.TempDir(), "s")) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("store %d: %v", i, errs[i])
			continue
		}
		defer stores[i].Close()
	}
	if t.Failed() {
		return
	}
	var rows, max int
	if err := stores[0].kr.QueryRow(`SELECT COUNT(*), MAX(version) FROM schema_version`).Scan(&rows, &max); err != nil {
		t.Fatal(err)
	}
	if rows != len(pgMigrations) || max != len(pgMigrations) {
		t.Errorf("schema_version has %d rows up to %d, want %d", rows, max, len(pgMigrations))
	}
}

// AuditFilter.Scoped works across servers: events about a sandbox created
// through one server, recorded by another, are the owner's to see.
func TestPGScopedAuditAcrossServers(t *testing.T) {
	b := backend{name: "postgres", url: pgtest.Shared(t).NewDatabase(t)}
	a, _ := b.openTest(t)
	other, _ := b.openTest(t)
	ctx := context.Background()
	if err := a.PutSandbox(ctx, &Sandbox{ID: "sb-owned", Owner: "key_a", State: StateRunning}); err != nil {
		t.Fatal(err)
	}
	// sb-remote has no owner row (a Kubernetes backend's sandbox): its
	// create event in the log makes it key_a's.
	if err := a.Audit(ctx, AuditEvent{KeyID: "key_a", SandboxID: "sb-remote", Action: ActionSandboxCreate}); err != nil {
		t.Fatal(err)
	}
	for _, ev := range []AuditEvent{
		{KeyID: "", SandboxID: "sb-owned", Action: "sandbox.lost"},
		{KeyID: "key_a", Action: "volume.create"},
		{KeyID: "key_b", SandboxID: "sb-other", Action: ActionExec},
		{KeyID: "", SandboxID: "sb-remote", Action: "sandbox.expired"},
	} {
		if err := other.Audit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := other.AuditLog(ctx, AuditFilter{Scoped: true, Owner: "key_a"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.Action)
	}
	if want := "sandbox.expired,volume.create,sandbox.lost,sandbox.create"; strings.Join(got, ",") != want {
		t.Errorf("key_a's scoped log on the other server = %v, want %s", got, want)
	}
}

// With PostgreSQL down, audit writes and key checks fail (so audited
// actions are refused) with an error naming the database but not its
// password; once it is back the same store works again.
func TestPGDownFailsClosed(t *testing.T) {
	c := pgtest.Shared(t)
	b := backend{name: "postgres", url: c.NewDatabase(t)}
	s, _ := b.openTest(t)
	ctx := context.Background()
	_, secret, err := s.CreateKey(ctx, "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Audit(ctx, AuditEvent{Action: "before"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Resume() })
	err = s.Audit(ctx, AuditEvent{Action: "during"})
	if err == nil {
		t.Fatal("audit write succeeded with PostgreSQL down")
	}
	if strings.Contains(err.Error(), c.Password()) || !strings.Contains(err.Error(), "PostgreSQL postgres://postgres:xxxxx@127.0.0.1") {
		t.Errorf("error does not name the database with its password hidden: %v", err)
	}
	t.Logf("audit with PostgreSQL down: %v", err)
	if _, err := s.Authenticate(ctx, secret); err == nil || errors.Is(err, ErrUnauthorized) {
		t.Errorf("Authenticate with PostgreSQL down = %v, want an error that is not ErrUnauthorized", err)
	}
	if _, err := OpenOptions(t.TempDir(), Options{DatabaseURL: b.url}); err == nil {
		t.Error("Open succeeded with PostgreSQL down")
	} else if strings.Contains(err.Error(), c.Password()) || !strings.Contains(err.Error(), "xxxxx") {
		t.Errorf("Open error does not name the database with its password hidden: %v", err)
	}

	if err := c.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := s.Audit(ctx, AuditEvent{Action: "after"}); err != nil {
		// A connection broken by the restart fails once at most.
		if err := s.Audit(ctx, AuditEvent{Action: "after"}); err != nil {
			t.Fatalf("audit after PostgreSQL came back: %v", err)
		}
	}
	if _, err := s.Authenticate(ctx, secret); err != nil {
		t.Errorf("Authenticate after PostgreSQL came back: %v", err)
	}
	evs, err := s.AuditLog(ctx, AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Action == "during" {
			t.Errorf("event reported as failed is in the log: %+v", e)
		}
	}
	if evs[len(evs)-1].Action != "before" || evs[0].Action != "after" {
		t.Errorf("log = %+v", evs)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@db:5432/airlock?sslmode=require": "postgres://u:xxxxx@db:5432/airlock?sslmode=require",
		"postgres://db/airlock?password=secret&user=u":        "postgres://db/airlock?password=xxxxx&user=u",
		"host=db user=u password=secret":                      "host=db user=u password=xxxxx",
		"host=db password = 'se cret\\' x' user=u":            "host=db password = xxxxx user=u",
		"postgres://u:pa%zz@db/airlock":                       "(unparsable database URL)",
		"postgres://u@db/airlock":                             "postgres://u@db/airlock",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A key's approval policy lives with the key in the shared database, for
// every server; without one the store refuses (policies are files then).
func TestPGKeyApprovalPolicy(t *testing.T) {
	b := backend{name: "postgres", url: pgtest.Shared(t).NewDatabase(t)}
	a, _ := b.openTest(t)
	other, _ := b.openTest(t)
	ctx := context.Background()
	k, _, err := a.CreateKey(ctx, "held", 0)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := other.KeyApprovalPolicy(ctx, k.ID); err != nil || p != nil {
		t.Fatalf("policy before any = %s, %v", p, err)
	}
	pol := json.RawMessage(`{"deny":[{"action":"exec","argv":"^pip"}]}`)
	if err := a.SetKeyApprovalPolicy(ctx, k.ID, pol); err != nil {
		t.Fatal(err)
	}
	if p, err := other.KeyApprovalPolicy(ctx, k.ID); err != nil || string(p) != string(pol) {
		t.Errorf("policy on the other server = %s, %v", p, err)
	}
	if err := a.SetKeyApprovalPolicy(ctx, "key_nope", pol); !errors.Is(err, ErrNotFound) {
		t.Errorf("policy of an unknown key: %v", err)
	}
	if err := a.SetKeyApprovalPolicy(ctx, k.ID, json.RawMessage(`{`)); err == nil {
		t.Error("invalid JSON stored")
	}
	local, _ := openTest(t)
	if err := local.SetKeyApprovalPolicy(ctx, k.ID, pol); !errors.Is(err, ErrNotShared) {
		t.Errorf("SQLite store: %v, want ErrNotShared", err)
	}
}

// Servers starting at once on one database agree on a shared secret.
func TestPGSharedSecret(t *testing.T) {
	b := backend{name: "postgres", url: pgtest.Shared(t).NewDatabase(t)}
	const n = 4
	stores := make([]*Store, n)
	for i := range stores {
		stores[i], _ = b.openTest(t)
	}
	got := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() { got[i], errs[i] = s.SharedSecret(context.Background(), "e2b.token_key", 32) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || len(got[i]) != 32 || string(got[i]) != string(got[0]) {
			t.Fatalf("server %d: secret %x, %v; server 0: %x", i, got[i], errs[i], got[0])
		}
	}
	if other, err := stores[0].SharedSecret(context.Background(), "other", 32); err != nil || string(other) == string(got[0]) {
		t.Errorf("another name gave %x, %v", other, err)
	}
	local, _ := openTest(t)
	if _, err := local.SharedSecret(context.Background(), "x", 32); !errors.Is(err, ErrNotShared) {
		t.Errorf("SQLite store: %v, want ErrNotShared", err)
	}
}

// A keyword/value connection string (libpq's other form) works too, and is
// shown without its password.
func TestPGKeywordDSN(t *testing.T) {
	c := pgtest.Shared(t)
	u, err := url.Parse(c.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	dsn := fmt.Sprintf("host=%s port=%s user=%s password='%s' dbname=%s sslmode=disable",
		u.Hostname(), u.Port(), u.User.Username(), pw, strings.TrimPrefix(u.Path, "/"))
	s, err := OpenOptions(t.TempDir(), Options{DatabaseURL: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d := s.SharedDatabase(); strings.Contains(d, pw) || !strings.Contains(d, "password='xxxxx'") && !strings.Contains(d, "password=xxxxx") {
		t.Errorf("SharedDatabase() = %q", d)
	}
	if _, _, err := s.CreateKey(context.Background(), "k", 0); err != nil {
		t.Fatal(err)
	}
}
