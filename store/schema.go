package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// migrations are applied in order; migrations[i] takes the schema from
// version i to version i+1. Never edit a released migration: append a new
// one.
var migrations = []string{
	// 1: initial schema.
	`
CREATE TABLE sandboxes (
	id         TEXT PRIMARY KEY NOT NULL,
	owner      TEXT NOT NULL DEFAULT '',
	profile    TEXT NOT NULL DEFAULT '',
	template   TEXT NOT NULL DEFAULT '',
	state      TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	expires_at INTEGER,
	ended_at   INTEGER,
	end_reason TEXT NOT NULL DEFAULT '',
	metadata   TEXT NOT NULL DEFAULT '{}',
	policy     TEXT,
	init_pid   INTEGER NOT NULL DEFAULT 0,
	runtime    TEXT,
	cgroup     TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX sandboxes_owner_state ON sandboxes(owner, state);
CREATE INDEX sandboxes_state_expires ON sandboxes(state, expires_at);

-- One row per metadata entry, rebuilt by PutSandbox, so that metadata
-- filters use an index instead of parsing every sandbox's JSON.
CREATE TABLE sandbox_meta (
	sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
	key        TEXT NOT NULL,
	value      TEXT NOT NULL,
	PRIMARY KEY (sandbox_id, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX sandbox_meta_kv ON sandbox_meta(key, value, sandbox_id);

CREATE TABLE api_keys (
	id            TEXT PRIMARY KEY NOT NULL,
	name          TEXT NOT NULL,
	hash          BLOB NOT NULL UNIQUE,
	created_at    INTEGER NOT NULL,
	revoked_at    INTEGER,
	max_sandboxes INTEGER NOT NULL DEFAULT 0
) STRICT;

-- id is an INTEGER PRIMARY KEY without AUTOINCREMENT: SQLite assigns
-- max(id)+1, and since rows can never be deleted ids are never reused
-- anyway; AUTOINCREMENT would only add a sqlite_sequence write to every
-- insert. Only the per-sandbox lookup is indexed, to keep inserts cheap;
-- filters by action or key scan backwards from the newest event.
CREATE TABLE audit (
	id         INTEGER PRIMARY KEY,
	time       INTEGER NOT NULL,
	key_id     TEXT NOT NULL DEFAULT '',
	sandbox_id TEXT NOT NULL DEFAULT '',
	action     TEXT NOT NULL,
	detail     TEXT
) STRICT;
CREATE INDEX audit_sandbox ON audit(sandbox_id, id);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN
	SELECT RAISE(ABORT, 'audit log is append-only');
END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN
	SELECT RAISE(ABORT, 'audit log is append-only');
END;
-- REPLACE removes the conflicting row without firing DELETE triggers
-- (unless recursive_triggers is on), so refuse inserts that would replace.
CREATE TRIGGER audit_no_replace BEFORE INSERT ON audit
WHEN EXISTS (SELECT 1 FROM audit WHERE id = NEW.id)
BEGIN
	SELECT RAISE(ABORT, 'audit log is append-only');
END;

CREATE TABLE network_log (
	id          INTEGER PRIMARY KEY,
	sandbox_id  TEXT NOT NULL,
	time        INTEGER NOT NULL,
	host        TEXT NOT NULL,
	port        INTEGER NOT NULL,
	allowed     INTEGER NOT NULL,
	reason      TEXT NOT NULL DEFAULT '',
	bytes_up    INTEGER NOT NULL DEFAULT 0,
	bytes_down  INTEGER NOT NULL DEFAULT 0,
	duration_ms INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX network_log_sandbox ON network_log(sandbox_id, id);
`,
	// 2: each sandbox's host uid/gid range (its first id; 0 when airlock is
	// not root), and per-key ceilings on what a sandbox may ask for (JSON
	// KeyLimits).
	`
ALTER TABLE sandboxes ADD COLUMN uid_base INTEGER NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN max_limits TEXT NOT NULL DEFAULT '{}';
`,
	// 3: admin keys (APIKey.Admin), which manage the other keys through
	// /v1/keys (every key made before is not one), and when each key was
	// last used (APIKey.LastUsedAt; unknown for keys before).
	`
ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1));
ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER;
`,
}

// migrate brings the database up to the latest schema version. Each migration runs in its
// own IMMEDIATE transaction that re-reads the version first, so two processes
// opening the same new state directory cannot both apply it.
func migrate(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
	version    INTEGER PRIMARY KEY,
	applied_at INTEGER NOT NULL
) STRICT`); err != nil {
		return fmt.Errorf("store: create schema_version: %w", err)
	}
	for {
		done, err := migrateOne(ctx, db)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
	}
}

// migrateOne applies the next pending migration, reporting done when there is
// none.
func migrateOne(ctx context.Context, db *sql.DB) (done bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("store: begin migration: %w", err)
	}
	defer tx.Rollback()
	var v int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&v); err != nil {
		return false, fmt.Errorf("store: read schema version: %w", err)
	}
	switch {
	case v > len(migrations):
		return false, fmt.Errorf("store: database schema version %d is newer than this binary's %d", v, len(migrations))
	case v == len(migrations):
		return true, nil
	}
	if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
		return false, fmt.Errorf("store: migrate schema to version %d: %w", v+1, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version(version, applied_at) VALUES (?, ?)`,
		v+1, time.Now().UnixNano()); err != nil {
		return false, fmt.Errorf("store: record schema version %d: %w", v+1, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("store: commit schema version %d: %w", v+1, err)
	}
	return false, nil
}
