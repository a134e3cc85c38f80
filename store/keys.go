package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// SecretPrefix starts every API key secret.
const SecretPrefix = "al_"

// secretBytes is the number of random bytes in a secret.
const secretBytes = 32

// secretLen is the length of a well-formed secret.
var secretLen = len(SecretPrefix) + base64.RawURLEncoding.EncodedLen(secretBytes)

// keyCacheTTL bounds how long a verified key is trusted from memory. Revoking
// through this Store takes effect at once, and so does revoking through
// another process sharing the state directory: RevokeKey rewrites
// RevokedFile, whose change (one stat per request) empties every cache.
// The TTL only bounds a revocation made by editing the database directly.
const keyCacheTTL = 10 * time.Second

// RevokedFile, in the state directory, is rewritten by every RevokeKey so
// that other processes drop their cached keys at once.
const RevokedFile = "keys.revoked"

// APIKey is a stored API key. The secret itself is never stored, only its
// SHA-256.
type APIKey struct {
	// ID identifies the key ("key_" and 16 hex digits); it is not secret.
	ID string
	// Name is a human label.
	Name string
	// CreatedAt is when the key was created.
	CreatedAt time.Time
	// RevokedAt is when the key was revoked; nil while valid.
	RevokedAt *time.Time
	// MaxSandboxes is how many sandboxes the key may have running at
	// once; 0 means no per-key limit. The store records it; the caller
	// enforces it (see CountSandboxes).
	MaxSandboxes int
	// Limits caps what each sandbox of the key may ask for, below the
	// server's own ceilings. The store records it; the caller enforces it.
	Limits KeyLimits
	// Admin keys may manage every key (the server's /v1/keys). Only a key's
	// creation sets it: no call changes it later, so no key can make itself
	// (or another existing key) an admin.
	Admin bool
	// LastUsedAt is when the key last authenticated, to within
	// LastUsedEvery (nil: not since it was made, or before this was
	// tracked). Recording it is best effort: a failed write never fails
	// the request.
	LastUsedAt *time.Time
}

// LastUsedEvery is how often a key's last use is written: at most once per
// key and period, so that a busy key costs one write a minute.
const LastUsedEvery = time.Minute

// KeySpec describes a key to create (CreateKeySpec).
type KeySpec struct {
	// Name is a human label; required.
	Name string
	// MaxSandboxes is the key's cap on running sandboxes; 0 means none of
	// its own.
	MaxSandboxes int
	// Limits are the key's own ceilings on each sandbox.
	Limits KeyLimits
	// Admin makes an admin key.
	Admin bool
}

// ErrLastAdmin is returned (wrapped) by RevokeKey for the last live admin
// key: revoking it would leave no key that can manage keys.
var ErrLastAdmin = errors.New("the last live admin key cannot be revoked (create another admin key first)")

// KeyLimits are per-key maximums on a sandbox's resources. A zero field
// means the key adds no cap of its own (the server's ceiling applies).
type KeyLimits struct {
	MemoryBytes    int64   `json:"memory_bytes,omitempty"`
	CPUs           float64 `json:"cpus,omitempty"`
	Pids           int64   `json:"pids,omitempty"`
	DiskBytes      int64   `json:"disk_bytes,omitempty"`
	TimeoutSeconds int64   `json:"timeout_s,omitempty"`
}

// validate refuses negative maximums.
func (l KeyLimits) validate() error {
	if l.MemoryBytes < 0 || l.CPUs < 0 || l.Pids < 0 || l.DiskBytes < 0 || l.TimeoutSeconds < 0 {
		return errors.New("negative limit")
	}
	return nil
}

// cachedKey is a key verified against the database at checked.
type cachedKey struct {
	key     APIKey
	hash    [32]byte
	checked time.Time
}

// keyColumns are the api_keys columns scanKey reads, in its order.
const keyColumns = `id, name, hash, created_at, revoked_at, max_sandboxes, max_limits, admin, last_used_at`

const sqlKeyByHash = `SELECT ` + keyColumns + ` FROM api_keys WHERE hash = ?`

// CreateKey creates an API key and returns it with its secret, formatted
// "al_" followed by 32 random bytes in unpadded base64url. The secret is not
// stored and cannot be recovered.
func (s *Store) CreateKey(ctx context.Context, name string, maxSandboxes int) (*APIKey, string, error) {
	return s.CreateKeyLimits(ctx, name, maxSandboxes, KeyLimits{})
}

// CreateKeyLimits is CreateKey with per-sandbox maximums for the key.
func (s *Store) CreateKeyLimits(ctx context.Context, name string, maxSandboxes int, lim KeyLimits) (*APIKey, string, error) {
	return s.CreateKeySpec(ctx, KeySpec{Name: name, MaxSandboxes: maxSandboxes, Limits: lim})
}

// CreateKeySpec creates the key spec describes (an admin key with
// spec.Admin) and returns it with its secret, as CreateKey.
func (s *Store) CreateKeySpec(ctx context.Context, spec KeySpec) (*APIKey, string, error) {
	name, maxSandboxes, lim := spec.Name, spec.MaxSandboxes, spec.Limits
	if maxSandboxes < 0 {
		return nil, "", fmt.Errorf("store: create key %q: negative sandbox limit %d", name, maxSandboxes)
	}
	if err := lim.validate(); err != nil {
		return nil, "", fmt.Errorf("store: create key %q: %w", name, err)
	}
	limJSON, err := json.Marshal(lim)
	if err != nil {
		return nil, "", fmt.Errorf("store: create key %q: limits: %w", name, err)
	}
	var raw [secretBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, "", fmt.Errorf("store: create key %q: random secret: %w", name, err)
	}
	secret := SecretPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	var idb [8]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, "", fmt.Errorf("store: create key %q: random id: %w", name, err)
	}
	k := &APIKey{
		ID:           "key_" + hex.EncodeToString(idb[:]),
		Name:         name,
		CreatedAt:    time.Now().UTC(),
		MaxSandboxes: maxSandboxes,
		Limits:       lim,
		Admin:        spec.Admin,
	}
	h := sha256.Sum256([]byte(secret))
	if _, err := s.kw.ExecContext(ctx,
		s.q(`INSERT INTO api_keys (id, name, hash, created_at, max_sandboxes, max_limits, admin) VALUES (?, ?, ?, ?, ?, ?, ?)`),
		k.ID, k.Name, h[:], k.CreatedAt.UnixNano(), k.MaxSandboxes, string(limJSON), boolInt(k.Admin)); err != nil {
		return nil, "", fmt.Errorf("store: create key %q: %w", name, s.sharedErr(err))
	}
	return k, secret, nil
}

// wellFormed reports whether secret has the shape CreateKey produces, so that
// garbage is rejected without touching the database.
func wellFormed(secret string) bool {
	if len(secret) != secretLen || !strings.HasPrefix(secret, SecretPrefix) {
		return false
	}
	for _, c := range secret[len(SecretPrefix):] {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Authenticate returns the live key whose secret this is, or an error
// wrapping ErrUnauthorized if the secret is malformed, unknown or revoked.
//
// Keys are looked up by the SHA-256 of the secret, and the stored hash is
// compared in constant time. Verified keys are cached in memory by hash;
// RevokeKey evicts them at once, and cached entries are re-checked against
// the database every keyCacheTTL so that revocations by other processes are
// also seen. Each call returns a fresh copy the caller may modify.
//
// With a shared PostgreSQL database nothing is cached: every call reads the
// key, so a revocation through any server is refused by every server at
// once (other servers cannot signal a cache the way RevokedFile does on one
// host). An error that does not wrap ErrUnauthorized means the key could
// not be checked (the database is unreachable): the caller must refuse.
func (s *Store) Authenticate(ctx context.Context, secret string) (*APIKey, error) {
	if !wellFormed(secret) {
		return nil, ErrUnauthorized
	}
	h := sha256.Sum256([]byte(secret))
	var k *APIKey
	var err error
	if s.pg {
		// An unreachable database fails the request instead of holding it.
		ctx, cancel := context.WithTimeout(ctx, pgTimeout)
		defer cancel()
		k, err = s.keyByHash(ctx, h)
	} else {
		k, err = s.authenticateCached(ctx, h)
	}
	if err == nil {
		s.touchKey(ctx, k.ID)
	}
	return k, err
}

// touchKey records that key id was used now, if its last recorded use
// (by this Store) is LastUsedEvery old. A failed write is not an error of
// the request: the next use after LastUsedEvery tries again.
func (s *Store) touchKey(ctx context.Context, id string) {
	now := time.Now()
	s.usedMu.Lock()
	if last, ok := s.usedAt[id]; ok && now.Sub(last) < LastUsedEvery {
		s.usedMu.Unlock()
		return
	}
	if s.usedAt == nil {
		s.usedAt = map[string]time.Time{}
	}
	s.usedAt[id] = now
	s.usedMu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s.kw.ExecContext(ctx, s.q(`UPDATE api_keys SET last_used_at = ? WHERE id = ?`), now.UnixNano(), id)
}

// keyByHash reads the live key with hash h from the database.
func (s *Store) keyByHash(ctx context.Context, h [32]byte) (*APIKey, error) {
	k, stored, err := scanKey(s.keyByHsh.QueryRowContext(ctx, h[:]))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrUnauthorized
	}
	if err != nil {
		return nil, fmt.Errorf("store: authenticate: %w", s.sharedErr(err))
	}
	if subtle.ConstantTimeCompare(stored, h[:]) != 1 || k.RevokedAt != nil {
		return nil, ErrUnauthorized
	}
	return k, nil
}

// authenticateCached is Authenticate through the key cache (SQLite).
func (s *Store) authenticateCached(ctx context.Context, h [32]byte) (*APIKey, error) {
	now := time.Now()
	s.checkRevocations()

	s.keyMu.RLock()
	e, ok := s.keyCache[h]
	gen := s.keyGen
	ttl := s.keyTTL
	s.keyMu.RUnlock()
	if ok && now.Sub(e.checked) < ttl && subtle.ConstantTimeCompare(e.hash[:], h[:]) == 1 {
		k := e.key
		return &k, nil
	}

	k, err := s.keyByHash(ctx, h)
	if err != nil {
		if ok && errors.Is(err, ErrUnauthorized) {
			s.keyMu.Lock()
			delete(s.keyCache, h)
			s.keyMu.Unlock()
		}
		return nil, err
	}
	s.keyMu.Lock()
	// A RevokeKey that ran since gen was read may have revoked this very
	// key after our read; caching it then would resurrect it.
	if s.keyGen == gen {
		s.keyCache[h] = cachedKey{key: *k, hash: h, checked: now}
	}
	s.keyMu.Unlock()
	return k, nil
}

// GetKey returns the key with the given ID (revoked or not), or an error
// wrapping ErrNotFound.
func (s *Store) GetKey(ctx context.Context, id string) (*APIKey, error) {
	k, _, err := scanKey(s.kr.QueryRowContext(ctx,
		s.q(`SELECT `+keyColumns+` FROM api_keys WHERE id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: key %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: get key %q: %w", id, err)
	}
	return k, nil
}

// ListKeys returns every key, revoked ones included, oldest first. The
// result is never nil.
func (s *Store) ListKeys(ctx context.Context) ([]*APIKey, error) {
	rows, err := s.kr.QueryContext(ctx,
		`SELECT `+keyColumns+` FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list keys: %w", err)
	}
	defer rows.Close()
	out := []*APIKey{}
	for rows.Next() {
		k, _, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list keys: %w", err)
	}
	return out, nil
}

// RevokeKey revokes the key with the given ID; it stops authenticating
// through this Store immediately. Revoking a revoked key is a no-op that
// keeps the first revocation time. It returns an error wrapping ErrNotFound
// for an unknown ID, and one wrapping ErrLastAdmin for the last live admin
// key (which stays live).
func (s *Store) RevokeKey(ctx context.Context, id string) error {
	n, err := s.revoke(ctx, id)
	if err != nil {
		if !s.pg {
			err = s.spaceErr(err)
		}
		return fmt.Errorf("store: revoke key %q: %w", id, err)
	}
	s.forget(id)
	if n > 0 && !s.pg {
		// Tell the other processes on this state directory.
		stamp := []byte(strconv.FormatInt(time.Now().UnixNano(), 10) + " " + id + "\n")
		if err := os.WriteFile(filepath.Join(filepath.Dir(s.path), RevokedFile), stamp, 0o600); err != nil {
			return fmt.Errorf("store: key %q is revoked, but servers running on this state directory may accept it for up to %s more: %w",
				id, keyCacheTTL, s.spaceErr(err))
		}
	}
	if n == 0 {
		k, err := s.GetKey(ctx, id)
		if err != nil {
			return fmt.Errorf("store: revoke key: %w", err)
		}
		if k.RevokedAt == nil {
			// Live, yet not revoked: the guard kept the last admin.
			return fmt.Errorf("store: revoke key %q: %w", id, ErrLastAdmin)
		}
	}
	return nil
}

// revoke marks key id revoked unless it is revoked already or is the last
// live admin key, and returns how many rows it changed (0 or 1). One
// statement checks and revokes, which SQLite's single writer makes atomic;
// with PostgreSQL, whose concurrent transactions could each see the other's
// admin still live, an advisory lock serializes revocations first.
func (s *Store) revoke(ctx context.Context, id string) (int64, error) {
	const sqlRevoke = `UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL
AND (admin = 0 OR EXISTS (SELECT 1 FROM api_keys o WHERE o.admin <> 0 AND o.revoked_at IS NULL AND o.id <> ?))`
	now := time.Now().UnixNano()
	if !s.pg {
		res, err := s.kw.ExecContext(ctx, sqlRevoke, now, id, id)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	ctx, cancel := context.WithTimeout(ctx, pgTimeout)
	defer cancel()
	tx, err := s.kw.BeginTx(ctx, nil)
	if err != nil {
		return 0, s.sharedErr(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, pgLockKeys); err != nil {
		return 0, s.sharedErr(err)
	}
	res, err := tx.ExecContext(ctx, s.q(sqlRevoke), now, id, id)
	if err != nil {
		return 0, s.sharedErr(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, s.sharedErr(err)
	}
	return n, nil
}

// forget evicts key id from the cache once a change to it committed, and
// bumps the generation so that an Authenticate that read the key before
// the change does not cache what it read.
func (s *Store) forget(id string) {
	s.keyMu.Lock()
	s.keyGen++
	for h, e := range s.keyCache {
		if e.key.ID == id {
			delete(s.keyCache, h)
		}
	}
	s.keyMu.Unlock()
}

// SetKeyLimits replaces the live key id's own ceilings: its cap on running
// sandboxes (0: none of its own) and on each sandbox. The change applies
// from the key's next request through this Store (and, through another
// process, within keyCacheTTL; at once on a shared PostgreSQL database).
// It returns the updated key, or an error wrapping ErrNotFound for an
// unknown or revoked key.
func (s *Store) SetKeyLimits(ctx context.Context, id string, maxSandboxes int, lim KeyLimits) (*APIKey, error) {
	if maxSandboxes < 0 {
		return nil, fmt.Errorf("store: key %q: negative sandbox limit %d", id, maxSandboxes)
	}
	if err := lim.validate(); err != nil {
		return nil, fmt.Errorf("store: key %q: %w", id, err)
	}
	limJSON, err := json.Marshal(lim)
	if err != nil {
		return nil, fmt.Errorf("store: key %q: limits: %w", id, err)
	}
	res, err := s.kw.ExecContext(ctx, s.q(`UPDATE api_keys SET max_sandboxes = ?, max_limits = ? WHERE id = ? AND revoked_at IS NULL`),
		maxSandboxes, string(limJSON), id)
	if err != nil {
		return nil, fmt.Errorf("store: set limits of key %q: %w", id, s.sharedErr(err))
	}
	s.forget(id)
	if n, err := res.RowsAffected(); err != nil {
		return nil, fmt.Errorf("store: set limits of key %q: %w", id, err)
	} else if n == 0 {
		return nil, fmt.Errorf("store: no live key %q: %w", id, ErrNotFound)
	}
	return s.GetKey(ctx, id)
}

// boolInt is b as the 0 or 1 the admin column holds.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// scanKey reads one api_keys row and returns the key and its stored hash.
func scanKey(sc scanner) (*APIKey, []byte, error) {
	var (
		k       APIKey
		hash    []byte
		created int64
		revoked sql.NullInt64
		limits  string
		admin   int64
		used    sql.NullInt64
	)
	if err := sc.Scan(&k.ID, &k.Name, &hash, &created, &revoked, &k.MaxSandboxes, &limits, &admin, &used); err != nil {
		return nil, nil, err
	}
	k.Admin = admin != 0
	if used.Valid {
		t := fromNanos(used.Int64)
		k.LastUsedAt = &t
	}
	if err := json.Unmarshal([]byte(limits), &k.Limits); err != nil {
		return nil, nil, fmt.Errorf("key %q: decode limits: %w", k.ID, err)
	}
	k.CreatedAt = fromNanos(created)
	if revoked.Valid {
		t := fromNanos(revoked.Int64)
		k.RevokedAt = &t
	}
	return &k, hash, nil
}

// revStamp identifies one version of RevokedFile.
type revStamp struct {
	mtime int64
	size  int64
	ino   uint64
}

// checkRevocations empties the key cache if RevokedFile changed since the
// last call (a key was revoked, possibly by another process).
func (s *Store) checkRevocations() {
	var cur revStamp
	if fi, err := os.Stat(filepath.Join(filepath.Dir(s.path), RevokedFile)); err == nil {
		cur = revStamp{mtime: fi.ModTime().UnixNano(), size: fi.Size()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			cur.ino = uint64(st.Ino)
		}
	}
	s.keyMu.RLock()
	same := s.revSeen == cur
	s.keyMu.RUnlock()
	if same {
		return
	}
	s.keyMu.Lock()
	if s.revSeen != cur {
		s.revSeen = cur
		s.keyGen++
		clear(s.keyCache)
	}
	s.keyMu.Unlock()
}
