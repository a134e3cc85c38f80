package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// PostgreSQL holds what several servers must share (see Options): API
// keys, the audit log, the network log and which key owns each sandbox.
// Sandbox records stay in the node's SQLite database: they describe
// processes, cgroups and uid ranges of this host.
//
// The same SQL runs on both databases; the few differences are here (the
// schema, placeholders, the audit-order lock), chosen where the code knows
// s.pg.

// Advisory lock keys (pg_advisory_xact_lock) of airlock's database.
const (
	// pgLockMigrate serializes schema migrations of servers starting at once.
	pgLockMigrate int64 = 0x61697266_00000001
	// pgLockAudit serializes audit and network-log batches across servers, so
	// that ids are assigned in commit order: a reader paging by id never
	// misses an event that committed later with a smaller id.
	pgLockAudit int64 = 0x61697266_00000002
	// pgLockKeys serializes revocations of admin keys across servers, so
	// that two at once cannot revoke the last two admin keys.
	pgLockKeys int64 = 0x61697266_00000003
)

// pgTimeout bounds every batch written to PostgreSQL: an unreachable server
// fails the batch (and so refuses audited actions) instead of hanging them.
const pgTimeout = 15 * time.Second

// pgMigrations are PostgreSQL's schema versions, like migrations for SQLite.
// Never edit a released migration: append a new one.
var pgMigrations = []string{
	// 1: the shared tables.
	`
CREATE TABLE api_keys (
	id            TEXT PRIMARY KEY,
	name          TEXT NOT NULL,
	hash          BYTEA NOT NULL UNIQUE,
	created_at    BIGINT NOT NULL,
	revoked_at    BIGINT,
	max_sandboxes INTEGER NOT NULL DEFAULT 0,
	max_limits    TEXT NOT NULL DEFAULT '{}'
);

-- GENERATED ALWAYS: an insert cannot choose (and so forge) an id.
CREATE TABLE audit (
	id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	time       BIGINT NOT NULL,
	key_id     TEXT NOT NULL DEFAULT '',
	sandbox_id TEXT NOT NULL DEFAULT '',
	action     TEXT NOT NULL,
	detail     TEXT
);
CREATE INDEX audit_sandbox ON audit(sandbox_id, id);
CREATE FUNCTION airlock_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'audit log is append-only';
END $$;
CREATE TRIGGER audit_no_change BEFORE UPDATE OR DELETE ON audit
	FOR EACH ROW EXECUTE FUNCTION airlock_audit_append_only();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
	FOR EACH STATEMENT EXECUTE FUNCTION airlock_audit_append_only();

CREATE TABLE network_log (
	id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	sandbox_id  TEXT NOT NULL,
	time        BIGINT NOT NULL,
	host        TEXT NOT NULL,
	port        INTEGER NOT NULL,
	allowed     BOOLEAN NOT NULL,
	reason      TEXT NOT NULL DEFAULT '',
	bytes_up    BIGINT NOT NULL DEFAULT 0,
	bytes_down  BIGINT NOT NULL DEFAULT 0,
	duration_ms BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX network_log_sandbox ON network_log(sandbox_id, id);

-- Which key owns each sandbox, for AuditFilter.Scoped on any server.
CREATE TABLE sandbox_owners (
	sandbox_id TEXT PRIMARY KEY,
	owner      TEXT NOT NULL
);
CREATE INDEX sandbox_owners_owner ON sandbox_owners(owner);
`,
	// 2: each key's own approval policy (JSON), which a single server keeps
	// in files of its state directory (package approval).
	`
ALTER TABLE api_keys ADD COLUMN approval_policy TEXT;
`,
	// 3: random keys every server must hold the same (SharedSecret).
	`
CREATE TABLE secrets (
	name  TEXT PRIMARY KEY,
	value BYTEA NOT NULL
);
`,
	// 4: sandboxes' own approval policies (JSON), which a single server
	// keeps in files of its state directory (package approval).
	`
CREATE TABLE sandbox_approval_policies (
	sandbox_id TEXT PRIMARY KEY,
	policy     TEXT NOT NULL
);
`,
	// 5: approvals pending on one server, listed and answered through any
	// (approval.PendingStore).
	`
CREATE TABLE pending_approvals (
	id         TEXT PRIMARY KEY,
	pending    TEXT NOT NULL,
	expires_at BIGINT NOT NULL,
	decision   TEXT
);
CREATE INDEX pending_approvals_expires ON pending_approvals(expires_at);
`,
	// 6: the sandboxes each key created, from the log itself, for the
	// scoped view of sandboxes no server recorded an owner row for (a
	// Kubernetes backend's: their records are the cluster's objects).
	`
CREATE INDEX audit_creates ON audit(key_id, sandbox_id) WHERE action = 'sandbox.create';
`,
	// 7: admin keys (APIKey.Admin) and last use (APIKey.LastUsedAt), as
	// SQLite's migration 3: admin an INTEGER like SQLite's, so that one SQL
	// text serves both. Every key made before is not an admin.
	`
ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1));
ALTER TABLE api_keys ADD COLUMN last_used_at BIGINT;
`,
}

// openPG connects to the PostgreSQL database at rawURL and migrates its
// schema. Errors name the database without its password.
func openPG(ctx context.Context, rawURL string) (*sql.DB, string, error) {
	desc := RedactURL(rawURL)
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		// pgx's parse errors may quote the URL: do not pass them on.
		return nil, desc, fmt.Errorf("store: database URL %s: %w", desc, errors.New("cannot parse (want postgres://user:password@host:port/database?options)"))
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(4)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, desc, fmt.Errorf("store: connect to %s: %w", desc, err)
	}
	if err := migratePG(ctx, db); err != nil {
		db.Close()
		return nil, desc, fmt.Errorf("store: %s: %w", desc, err)
	}
	return db, desc, nil
}

// migratePG applies every pending PostgreSQL migration in one transaction
// under an advisory lock, so servers starting at once apply each migration
// exactly once (the others wait, then find nothing to do).
func migratePG(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, pgLockMigrate); err != nil {
		return fmt.Errorf("lock for migration: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
	version    INTEGER PRIMARY KEY,
	applied_at BIGINT NOT NULL
)`); err != nil {
		return fmt.Errorf("create schema_version: %w", err)
	}
	var v int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > len(pgMigrations) {
		return fmt.Errorf("database schema version %d is newer than this binary's %d", v, len(pgMigrations))
	}
	for ; v < len(pgMigrations); v++ {
		if _, err := tx.ExecContext(ctx, pgMigrations[v]); err != nil {
			return fmt.Errorf("migrate schema to version %d: %w", v+1, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)`,
			v+1, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("record schema version %d: %w", v+1, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit migration: %w", err)
	}
	return nil
}

// dsnPassword matches the password of a keyword/value connection string
// (host=db password='x y' ...), quoted or not.
var dsnPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)

// RedactURL returns a database URL fit for logs and errors: the password,
// in the user info or a password= parameter (of a URL or of a keyword/value
// connection string), replaced by "xxxxx". A URL that does not parse is
// replaced whole.
func RedactURL(raw string) string {
	if !strings.Contains(raw, "://") {
		return dsnPassword.ReplaceAllString(raw, "${1}xxxxx")
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return "(unparsable database URL)"
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// q returns query with SQLite's ? placeholders as PostgreSQL's $1, $2... when
// the shared tables live in PostgreSQL. Queries never hold a literal '?'.
func (s *Store) q(query string) string {
	if !s.pg {
		return query
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

// putOwnerPG records which key owns a running sandbox in the shared
// database, so that any server can scope the audit log to its owner.
func (s *Store) putOwnerPG(ctx context.Context, sb *Sandbox) error {
	if !s.pg || sb.State != StateRunning {
		return nil
	}
	if _, err := s.kw.ExecContext(ctx, `INSERT INTO sandbox_owners (sandbox_id, owner) VALUES ($1, $2)
ON CONFLICT (sandbox_id) DO UPDATE SET owner = excluded.owner`, sb.ID, sb.Owner); err != nil {
		return fmt.Errorf("store: put sandbox %q: record owner in %s: %w", sb.ID, s.pgDesc, err)
	}
	return nil
}

// SharedDatabase names the PostgreSQL database holding the shared tables,
// without its password; "" when they are in the state directory.
func (s *Store) SharedDatabase() string { return s.pgDesc }

// ErrNotShared means an operation needs a shared database (Options.DatabaseURL).
var ErrNotShared = errors.New("needs a shared database (--database-url)")

// SetKeyApprovalPolicy stores key id's own approval policy (JSON) with the
// key in the shared database, so that every server applies it; nil removes
// it. Without a shared database key policies are files in the state
// directory (approval.SaveKeyPolicy) and this returns an error wrapping
// ErrNotShared. An unknown key is an error wrapping ErrNotFound.
func (s *Store) SetKeyApprovalPolicy(ctx context.Context, id string, policy json.RawMessage) error {
	if !s.pg {
		return fmt.Errorf("store: set approval policy of key %q: %w", id, ErrNotShared)
	}
	v, err := rawJSON("approval policy", policy)
	if err != nil {
		return fmt.Errorf("store: set approval policy of key %q: %w", id, err)
	}
	res, err := s.kw.ExecContext(ctx, `UPDATE api_keys SET approval_policy = $1 WHERE id = $2`, v, id)
	if err != nil {
		return fmt.Errorf("store: set approval policy of key %q: %w", id, s.sharedErr(err))
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return fmt.Errorf("store: set approval policy of key %q: %w", id, ErrNotFound)
	}
	return nil
}

// KeyApprovalPolicy returns the policy SetKeyApprovalPolicy stored for key
// id: nil when the key has none or does not exist. An error (the database
// cannot be read) must refuse what the policy would judge.
func (s *Store) KeyApprovalPolicy(ctx context.Context, id string) (json.RawMessage, error) {
	if !s.pg {
		return nil, fmt.Errorf("store: approval policy of key %q: %w", id, ErrNotShared)
	}
	var v sql.NullString
	err := s.kr.QueryRowContext(ctx, `SELECT approval_policy FROM api_keys WHERE id = $1`, id).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !v.Valid) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: approval policy of key %q: %w", id, s.sharedErr(err))
	}
	return json.RawMessage(v.String), nil
}

// SharedSecret returns the random key called name that every server on the
// shared database uses (such as the E2B token key, which a single server
// keeps in its state directory), creating it with n random bytes on first
// use; servers racing to create it all get the one that was stored. Without
// a shared database it returns an error wrapping ErrNotShared.
func (s *Store) SharedSecret(ctx context.Context, name string, n int) ([]byte, error) {
	if !s.pg {
		return nil, fmt.Errorf("store: secret %q: %w", name, ErrNotShared)
	}
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("store: secret %q: %w", name, err)
	}
	if _, err := s.kw.ExecContext(ctx, `INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, b); err != nil {
		return nil, fmt.Errorf("store: secret %q: %w", name, s.sharedErr(err))
	}
	var v []byte
	if err := s.kr.QueryRowContext(ctx, `SELECT value FROM secrets WHERE name = $1`, name).Scan(&v); err != nil {
		return nil, fmt.Errorf("store: secret %q: %w", name, s.sharedErr(err))
	}
	if len(v) < n {
		return nil, fmt.Errorf("store: secret %q is %d bytes, want at least %d", name, len(v), n)
	}
	return v, nil
}

// SetSandboxApprovalPolicy stores a sandbox's own approval policy (JSON)
// in the shared database, for every server (approval.SandboxPolicyStore).
// A policy is set once, when the sandbox is created; setting it again
// replaces it. Without a shared database it returns an error wrapping
// ErrNotShared.
func (s *Store) SetSandboxApprovalPolicy(ctx context.Context, sandboxID string, policy json.RawMessage) error {
	if !s.pg {
		return fmt.Errorf("store: set approval policy of sandbox %q: %w", sandboxID, ErrNotShared)
	}
	if len(policy) == 0 || !json.Valid(policy) {
		return fmt.Errorf("store: set approval policy of sandbox %q: not JSON", sandboxID)
	}
	ctx, cancel := context.WithTimeout(ctx, pgTimeout)
	defer cancel()
	if _, err := s.kw.ExecContext(ctx, `INSERT INTO sandbox_approval_policies (sandbox_id, policy) VALUES ($1, $2)
ON CONFLICT (sandbox_id) DO UPDATE SET policy = excluded.policy`, sandboxID, string(policy)); err != nil {
		return fmt.Errorf("store: set approval policy of sandbox %q: %w", sandboxID, s.sharedErr(err))
	}
	return nil
}

// SandboxApprovalPolicy returns the policy SetSandboxApprovalPolicy stored
// for a sandbox, nil for none. An error must refuse what it would judge.
func (s *Store) SandboxApprovalPolicy(ctx context.Context, sandboxID string) (json.RawMessage, error) {
	if !s.pg {
		return nil, fmt.Errorf("store: approval policy of sandbox %q: %w", sandboxID, ErrNotShared)
	}
	ctx, cancel := context.WithTimeout(ctx, pgTimeout)
	defer cancel()
	var v string
	err := s.kr.QueryRowContext(ctx, `SELECT policy FROM sandbox_approval_policies WHERE sandbox_id = $1`, sandboxID).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: approval policy of sandbox %q: %w", sandboxID, s.sharedErr(err))
	}
	return json.RawMessage(v), nil
}

// pendingKeep is how long a pending approval's row outlives its expiry if
// the server holding it died before deleting it.
const pendingKeep = time.Hour

// PutPendingApproval records an approval pending on this server, for the
// others to list and answer (approval.PendingStore); rows of approvals
// long expired are dropped on the way. Without a shared database it
// returns an error wrapping ErrNotShared.
func (s *Store) PutPendingApproval(ctx context.Context, id string, pending json.RawMessage, expires time.Time) error {
	if !s.pg {
		return fmt.Errorf("store: pending approval %s: %w", id, ErrNotShared)
	}
	ctx, cancel := context.WithTimeout(ctx, pgTimeout)
	defer cancel()
	if _, err := s.kw.ExecContext(ctx, `DELETE FROM pending_approvals WHERE expires_at < $1`,
		time.Now().Add(-pendingKeep).UnixNano()); err != nil {
		return fmt.Errorf("store: pending approval %s: %w", id, s.sharedErr(err))
	}
	if _, err := s.kw.ExecContext(ctx, `INSERT INTO pending_approvals (id, pending, expires_at) VALUES ($1, $2, $3)`,
		id, string(pending), expires.UnixNano()); err != nil {
		return fmt.Errorf("store: pending approval %s: %w", id, s.sharedErr(err))
	}
	return nil
}

// AnswerPendingApproval records the decision of an undecided approval,
// reporting false when it is unknown or already decided (the first answer
// wins).
func (s *Store) AnswerPendingApproval(ctx context.Context, id string, decision json.RawMessage) (bool, error) {
	if !s.pg {
		return false, fmt.Errorf("store: answer approval %s: %w", id, ErrNotShared)
	}
	ctx, cancel := context.WithTimeout(ctx, pgTimeout)
	defer cancel()
	res, err := s.kw.ExecContext(ctx, `UPDATE pending_approvals SET decision = $1 WHERE id = $2 AND decision IS NULL`,
		string(decision), id)
	if err != nil {
		return false, fmt.Errorf("store: answer approval %s: %w", id, s.sharedErr(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: answer approval %s: %w", id, s.sharedErr(err))
	}
	return n == 1, nil
}

// PendingApproval returns a pending approval and its decision (nil while
// undecided); pending is nil when the approval is unknown.
func (s *Store) PendingApproval(ctx context.Context, id string) (pending, decision json.RawMessage, err error) {
	if !s.pg {
		return nil, nil, fmt.Errorf("store: approval %s: %w", id, ErrNotShared)
	}
	ctx, cancel := context.WithTimeout(ctx, pgTimeout)
	defer cancel()
	var p string
	var d sql.NullString
	err = s.kr.QueryRowContext(ctx, `SELECT pending, decision FROM pending_approvals WHERE id = $1`, id).Scan(&p, &d)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("store: approval %s: %w", id, s.sharedErr(err))
	}
	if d.Valid {
		decision = json.RawMessage(d.String)
	}
	return json.RawMessage(p), decision, nil
}

// PendingApprovals returns the undecided, unexpired approvals of every
// server, oldest first.
func (s *Store) PendingApprovals(ctx context.Context) ([]json.RawMessage, error) {
	if !s.pg {
		return nil, fmt.Errorf("store: pending approvals: %w", ErrNotShared)
	}
	ctx, cancel := context.WithTimeout(ctx, pgTimeout)
	defer cancel()
	rows, err := s.kr.QueryContext(ctx, `SELECT pending FROM pending_approvals
WHERE decision IS NULL AND expires_at > $1 ORDER BY expires_at, id`, time.Now().UnixNano())
	if err != nil {
		return nil, fmt.Errorf("store: pending approvals: %w", s.sharedErr(err))
	}
	defer rows.Close()
	out := []json.RawMessage{}
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return nil, fmt.Errorf("store: pending approvals: %w", s.sharedErr(err))
		}
		out = append(out, json.RawMessage(p))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: pending approvals: %w", s.sharedErr(err))
	}
	return out, nil
}

// DeletePendingApproval forgets an approval whose request has ended.
func (s *Store) DeletePendingApproval(ctx context.Context, id string) error {
	if !s.pg {
		return fmt.Errorf("store: approval %s: %w", id, ErrNotShared)
	}
	ctx, cancel := context.WithTimeout(ctx, pgTimeout)
	defer cancel()
	if _, err := s.kw.ExecContext(ctx, `DELETE FROM pending_approvals WHERE id = $1`, id); err != nil {
		return fmt.Errorf("store: approval %s: %w", id, s.sharedErr(err))
	}
	return nil
}
