package store

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// openTest opens a store in a fresh temporary state dir and closes it when
// the test ends.
func openTest(t testing.TB) (*Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, dir
}

func TestOpenPermissions(t *testing.T) {
	s, dir := openTest(t)
	ctx := context.Background()
	// Write something so the -wal and -shm files exist.
	if err := s.Audit(ctx, AuditEvent{Action: ActionExec}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o700 {
		t.Errorf("state dir mode = %o, want 700", got)
	}
	for _, name := range []string{DBFile, DBFile + "-wal", DBFile + "-shm"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got := fi.Mode().Perm(); got != 0o600 {
			t.Errorf("%s mode = %o, want 600", name, got)
		}
	}
	if got, want := s.Path(), filepath.Join(dir, DBFile); got != want {
		t.Errorf("Path() = %q, want %q", got, want)
	}
}

func TestOpenTightensLooseDBFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, DBFile)
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("db mode = %o, want 600", got)
	}
}

func TestOpenOddPath(t *testing.T) {
	// A '?' or '#' in the path must not be taken for a DSN query.
	dir := filepath.Join(t.TempDir(), "a?b#c d%20")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(filepath.Join(dir, DBFile)); err != nil {
		t.Errorf("database not where expected: %v", err)
	}
}

func TestWALAndSchemaVersion(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	var mode string
	if err := s.r.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
	var busy int
	if err := s.r.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if busy != int(busyTimeout.Milliseconds()) {
		t.Errorf("busy_timeout = %d", busy)
	}
	var v int
	if err := s.r.QueryRowContext(ctx, "SELECT MAX(version) FROM schema_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != len(migrations) {
		t.Errorf("schema version = %d, want %d", v, len(migrations))
	}
}

func TestOpenRejectsNewerSchema(t *testing.T) {
	s, dir := openTest(t)
	if _, err := s.w.Exec(`INSERT INTO schema_version(version, applied_at) VALUES (?, 0)`, len(migrations)+1); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir)
	if err == nil {
		s2.Close()
		t.Fatal("Open succeeded on a database from a newer binary")
	}
}

func TestReopenKeepsData(t *testing.T) { eachBackend(t, testReopenKeepsData) }

func testReopenKeepsData(t *testing.T, b backend) {
	dir := t.TempDir()
	ctx := context.Background()
	s, err := b.open(dir)
	if err != nil {
		t.Fatal(err)
	}
	sb := testSandbox("sb-1")
	if err := s.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	key, secret, err := s.CreateKey(ctx, "ci", 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Audit(ctx, AuditEvent{KeyID: key.ID, SandboxID: "sb-1", Action: ActionSandboxCreate}); err != nil {
		t.Fatal(err)
	}
	if err := s.LogConnection(ctx, Connection{SandboxID: "sb-1", Host: "example.com", Port: 443, Allowed: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.Audit(ctx, AuditEvent{Action: ActionExec}); !errors.Is(err, ErrClosed) {
		t.Errorf("Audit after Close: %v, want ErrClosed", err)
	}

	s, err = b.open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.GetSandbox(ctx, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	assertSandbox(t, got, sb)
	k, err := s.Authenticate(ctx, secret)
	if err != nil {
		t.Fatalf("Authenticate after reopen: %v", err)
	}
	if k.ID != key.ID || k.MaxSandboxes != 3 {
		t.Errorf("key after reopen = %+v", k)
	}
	evs, err := s.AuditLog(ctx, AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Action != ActionSandboxCreate {
		t.Errorf("audit after reopen = %+v", evs)
	}
	conns, err := s.Connections(ctx, "sb-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 1 || conns[0].Host != "example.com" {
		t.Errorf("connections after reopen = %+v", conns)
	}
}

func TestTwoStoresSameDir(t *testing.T) { eachBackend(t, testTwoStoresSameDir) }

func testTwoStoresSameDir(t *testing.T, be backend) {
	// Another airlock process (e.g. a CLI command) may open the state dir
	// while the server runs; both must work.
	a, dir := be.openTest(t)
	b, err := be.open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := a.PutSandbox(ctx, testSandbox("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetSandbox(ctx, "x"); err != nil {
		t.Errorf("second store does not see the first's write: %v", err)
	}
	if err := b.Audit(ctx, AuditEvent{Action: ActionExec}); err != nil {
		t.Fatal(err)
	}
	if evs, err := a.AuditLog(ctx, AuditFilter{}); err != nil || len(evs) != 1 {
		t.Errorf("AuditLog = %v, %v", evs, err)
	}
}

func TestTimeRange(t *testing.T) {
	s, _ := openTest(t)
	sb := testSandbox("far")
	sb.ExpiresAt = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.PutSandbox(context.Background(), sb); err == nil {
		t.Error("PutSandbox accepted an expiry past 2262")
	}
}

// rawExec runs SQL on the writer connection, bypassing the API.
func rawExec(t *testing.T, db *sql.DB, q string, args ...any) error {
	t.Helper()
	_, err := db.Exec(q, args...)
	return err
}
