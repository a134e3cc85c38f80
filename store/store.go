// Package store persists airlock's state in a SQLite database inside a state
// directory: sandboxes, API keys, the append-only audit log and the network
// log. With Options.DatabaseURL, API keys, the audit log and the network log
// live in a PostgreSQL database instead, shared by every server given the
// same URL (see pg.go); sandbox records stay in SQLite.
//
// The database is opened through modernc.org/sqlite, so the binary stays
// CGO-free. It runs in WAL mode with one writer connection and a small pool
// of reader connections: writes are serialized in Go rather than by SQLite's
// busy handler, and reads never wait for writes.
//
// All times are stored as Unix nanoseconds and returned in UTC; a zero
// time.Time is stored as NULL where the column is optional. Times outside the
// range of int64 nanoseconds (years 1678 to 2262) are rejected.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// DBFile is the name of the database file inside the state directory.
const DBFile = "airlock.db"

// busyTimeout is how long a connection waits for a lock held by another
// process (another airlock invocation on the same state directory) before
// failing with SQLITE_BUSY.
const busyTimeout = 10 * time.Second

// Errors returned by the store, usually wrapped with context. Test for
// them with errors.Is.
var (
	// ErrNotFound means the sandbox or key does not exist.
	ErrNotFound = errors.New("not found")
	// ErrUnauthorized means a secret does not belong to a live API key:
	// it is malformed, unknown or revoked.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrEnded means the sandbox has already ended; the first end wins.
	ErrEnded = errors.New("sandbox already ended")
	// ErrClosed means the Store has been closed.
	ErrClosed = errors.New("store is closed")
)

// Store is an open state database. It is safe for concurrent use.
type Store struct {
	path string
	w    *sql.DB // exactly one connection: all writes go through it
	r    *sql.DB // read-only pool

	// The shared tables (api_keys, audit, network_log): w and r, or one
	// PostgreSQL pool for both when pg is set (pgDesc names it, without
	// the password).
	kw, kr *sql.DB
	pg     bool
	pgDesc string

	insAudit *sql.Stmt // on kw
	insConn  *sql.Stmt // on kw
	keyByHsh *sql.Stmt // on kr

	// Write queue for audit and network-log appends (see audit.go).
	qmu        sync.RWMutex // guards closed and sends on queue
	wmu        sync.Mutex   // held while an append is written (writeNow, writeLoop)
	closed     bool
	queue      chan *writeReq
	writerDone chan struct{}

	// Authenticated-key cache (see keys.go).
	keyMu    sync.RWMutex
	keyCache map[[32]byte]cachedKey
	keyGen   uint64
	keyTTL   time.Duration
	revSeen  revStamp // RevokedFile as last seen (keys.go)

	// When each key's last use was last written (touchKey).
	usedMu sync.Mutex
	usedAt map[string]time.Time

	closeOnce sync.Once
	closeErr  error
}

// Options configure OpenOptions.
type Options struct {
	// DatabaseURL, when set, is a PostgreSQL URL
	// (postgres://user:password@host:port/database?sslmode=...) holding
	// the API keys, the audit log and the network log, so that several
	// servers share them. Empty keeps everything in the state directory.
	DatabaseURL string
}

// Open opens the state database in dir, creating dir (mode 0700) and
// dir/airlock.db (mode 0600) if needed, and migrates the schema to the
// version this binary knows. An existing dir keeps its permissions; the
// database file is always set to 0600.
func Open(dir string) (*Store, error) { return OpenOptions(dir, Options{}) }

// OpenOptions is Open with options: with o.DatabaseURL the shared tables
// are in that PostgreSQL database, whose schema is migrated too.
func OpenOptions(dir string, o Options) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("store: state dir %q: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("store: create state dir: %w", err)
	}
	path := filepath.Join(abs, DBFile)
	// Create the file ourselves so it never exists with a looser mode;
	// SQLite gives the -wal and -shm files the database file's mode.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: create database: %w", noSpace(abs, err))
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("store: chmod database: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("store: create database: %w", noSpace(abs, err))
	}

	s := &Store{
		path:       path,
		queue:      make(chan *writeReq, queueSize),
		writerDone: make(chan struct{}),
		keyCache:   make(map[[32]byte]cachedKey),
		keyTTL:     keyCacheTTL,
	}
	if err := s.open(); err != nil {
		s.closeDBs()
		return nil, s.spaceErr(err)
	}
	s.kw, s.kr = s.w, s.r
	if o.DatabaseURL != "" {
		db, desc, err := openPG(context.Background(), o.DatabaseURL)
		if err != nil {
			s.closeDBs()
			return nil, err
		}
		s.kw, s.kr, s.pg, s.pgDesc = db, db, true, desc
	}
	if err := s.prepare(); err != nil {
		s.closeDBs()
		return nil, err
	}
	go s.writeLoop()
	return s, nil
}

// open opens both SQLite pools and migrates.
func (s *Store) open() error {
	ctx := context.Background()
	var err error

	// The writer converts the database to WAL (a persistent setting) and
	// uses BEGIN IMMEDIATE so a transaction never has to upgrade a read
	// lock, which could fail with SQLITE_BUSY regardless of busy_timeout.
	s.w, err = sql.Open("sqlite", dsn(s.path, url.Values{
		"_journal_mode": {"WAL"},
		"_synchronous":  {"NORMAL"},
		"_txlock":       {"immediate"},
	}))
	if err != nil {
		return fmt.Errorf("store: open writer: %w", err)
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)
	if err := s.w.PingContext(ctx); err != nil {
		return fmt.Errorf("store: open %s: %w", s.path, err)
	}
	var mode string
	if err := s.w.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("store: read journal mode: %w", err)
	}
	if mode != "wal" {
		return fmt.Errorf("store: %s: journal mode is %q, want wal", s.path, mode)
	}
	if err := migrate(ctx, s.w); err != nil {
		return err
	}

	s.r, err = sql.Open("sqlite", dsn(s.path, url.Values{
		"_query_only": {"1"},
		// Matters only when a reader runs a checkpoint as it closes.
		"_synchronous": {"NORMAL"},
	}))
	if err != nil {
		return fmt.Errorf("store: open readers: %w", err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	s.r.SetMaxOpenConns(n)
	s.r.SetMaxIdleConns(n)
	if err := s.r.PingContext(ctx); err != nil {
		return fmt.Errorf("store: open reader on %s: %w", s.path, err)
	}
	return nil
}

// prepare prepares the hot statements on the shared tables' pools.
func (s *Store) prepare() error {
	ctx := context.Background()
	var err error
	if s.insAudit, err = s.kw.PrepareContext(ctx, s.q(sqlInsertAudit)); err != nil {
		return fmt.Errorf("store: prepare audit insert: %w", err)
	}
	if s.insConn, err = s.kw.PrepareContext(ctx, s.q(sqlInsertConn)); err != nil {
		return fmt.Errorf("store: prepare network log insert: %w", err)
	}
	if s.keyByHsh, err = s.kr.PrepareContext(ctx, s.q(sqlKeyByHash)); err != nil {
		return fmt.Errorf("store: prepare key lookup: %w", err)
	}
	return nil
}

// dsn builds a file: URI for path with the given driver parameters plus the
// ones every connection needs. Escaping the path keeps a '?' or '#' in the
// state directory from being read as the start of the query.
func dsn(path string, q url.Values) string {
	q.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	q.Set("_foreign_keys", "1")
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(path), RawQuery: q.Encode()}
	return u.String()
}

// Path returns the absolute path of the database file.
func (s *Store) Path() string { return s.path }

// Close flushes every queued audit and network-log write, then closes the
// database. It is safe to call more than once; later calls return the result
// of the first.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.qmu.Lock()
		s.closed = true
		close(s.queue)
		s.qmu.Unlock()
		<-s.writerDone
		s.closeErr = s.closeDBs()
	})
	return s.closeErr
}

// closeDBs closes statements and pools that were opened, joining errors.
func (s *Store) closeDBs() error {
	var errs []error
	for _, st := range []*sql.Stmt{s.insAudit, s.insConn, s.keyByHsh} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	if s.pg {
		errs = append(errs, s.kw.Close())
	}
	if s.r != nil {
		errs = append(errs, s.r.Close())
	}
	if s.w != nil {
		errs = append(errs, s.w.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("store: close: %w", err)
	}
	return nil
}

// nanos converts t to Unix nanoseconds for storage; the zero time becomes
// NULL.
func nanos(t time.Time) (any, error) {
	if t.IsZero() {
		return nil, nil
	}
	n, err := mustNanos(t)
	if err != nil {
		return nil, err
	}
	return n, nil
}

// minTime and maxTime bound what int64 Unix nanoseconds can represent.
var (
	minTime = time.Unix(0, -1<<63)
	maxTime = time.Unix(0, 1<<63-1)
)

// mustNanos converts a required time to Unix nanoseconds.
func mustNanos(t time.Time) (int64, error) {
	if t.Before(minTime) || t.After(maxTime) {
		return 0, fmt.Errorf("store: time %s out of range", t.Format(time.RFC3339))
	}
	return t.UnixNano(), nil
}

// fromNanos converts stored Unix nanoseconds back to a UTC time.
func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// fromNullNanos converts an optional stored time; NULL becomes the zero time.
func fromNullNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return fromNanos(n.Int64)
}

// rawJSON turns an optional JSON value into a column value (NULL when empty).
func rawJSON(what string, m []byte) (any, error) {
	if len(m) == 0 {
		return nil, nil
	}
	if !json.Valid(m) {
		return nil, fmt.Errorf("store: %s is not valid JSON", what)
	}
	return string(m), nil
}
