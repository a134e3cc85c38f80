package store

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Admin keys: the flag round-trips through every read, and the last live
// admin key cannot be revoked (it keeps working), on both backends.
func TestAdminKeys(t *testing.T) { eachBackend(t, testAdminKeys) }

func testAdminKeys(t *testing.T, b backend) {
	s, _ := b.openTest(t)
	ctx := context.Background()
	admin, adminSecret, err := s.CreateKeySpec(ctx, KeySpec{Name: "ops", Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	user, _, err := s.CreateKey(ctx, "user", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !admin.Admin || user.Admin {
		t.Fatalf("created admin=%v user=%v", admin.Admin, user.Admin)
	}
	if k, err := s.Authenticate(ctx, adminSecret); err != nil || !k.Admin {
		t.Fatalf("Authenticate(admin) = %+v, %v", k, err)
	}
	if k, err := s.GetKey(ctx, user.ID); err != nil || k.Admin || k.LastUsedAt != nil {
		t.Fatalf("GetKey(user) = %+v, %v (never used)", k, err)
	}
	if k, err := s.GetKey(ctx, admin.ID); err != nil || k.LastUsedAt == nil || time.Since(*k.LastUsedAt) > time.Minute {
		t.Fatalf("GetKey(admin) after its use = %+v, %v: want its last use", k, err)
	}
	keys, err := s.ListKeys(ctx)
	if err != nil || len(keys) != 2 || !keys[0].Admin || keys[1].Admin {
		t.Fatalf("ListKeys = %+v, %v", keys, err)
	}

	// The only admin key: refused, and still live.
	if err := s.RevokeKey(ctx, admin.ID); !errors.Is(err, ErrLastAdmin) {
		t.Fatalf("revoking the last admin key: %v, want ErrLastAdmin", err)
	}
	if _, err := s.Authenticate(ctx, adminSecret); err != nil {
		t.Fatalf("the last admin key stopped working after a refused revocation: %v", err)
	}
	// A second admin makes the first revocable; then the second is the last.
	admin2, _, err := s.CreateKeySpec(ctx, KeySpec{Name: "ops2", Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeKey(ctx, admin.ID); err != nil {
		t.Fatalf("revoking one of two admin keys: %v", err)
	}
	if _, err := s.Authenticate(ctx, adminSecret); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("revoked admin key still authenticates: %v", err)
	}
	if err := s.RevokeKey(ctx, admin2.ID); !errors.Is(err, ErrLastAdmin) {
		t.Fatalf("revoking the new last admin key: %v, want ErrLastAdmin", err)
	}
	// Revoking a revoked admin stays a no-op; non-admin keys are unaffected.
	if err := s.RevokeKey(ctx, admin.ID); err != nil {
		t.Fatalf("revoking a revoked key again: %v", err)
	}
	if err := s.RevokeKey(ctx, user.ID); err != nil {
		t.Fatal(err)
	}
}

// Several revocations of different admin keys at once (through different
// stores: servers sharing a database, or processes sharing a state
// directory) leave at least one admin live: exactly one of two succeeds.
func TestRevokeAdminsRace(t *testing.T) { eachBackend(t, testRevokeAdminsRace) }

func testRevokeAdminsRace(t *testing.T, b backend) {
	s, dir := b.openTest(t)
	other := s
	if b.url != "" {
		other, _ = b.openTest(t)
	} else {
		o, err := b.open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		other = o
	}
	ctx := context.Background()
	for round := range 5 {
		// Exactly two live admin keys: a1 and a2.
		if err := rawExec(t, s.kw, `UPDATE api_keys SET revoked_at = 1 WHERE revoked_at IS NULL`); err != nil {
			t.Fatal(err)
		}
		a1, _, err := s.CreateKeySpec(ctx, KeySpec{Name: "a1", Admin: true})
		if err != nil {
			t.Fatal(err)
		}
		a2, _, err := other.CreateKeySpec(ctx, KeySpec{Name: "a2", Admin: true})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		wg.Go(func() { errs[0] = s.RevokeKey(ctx, a1.ID) })
		wg.Go(func() { errs[1] = other.RevokeKey(ctx, a2.ID) })
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, ErrLastAdmin):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d of two concurrent revocations of the last two admin keys succeeded (%v)", round, ok, errs)
		}
		live := 0
		keys, err := s.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if k.Admin && k.RevokedAt == nil {
				live++
			}
		}
		if live != 1 {
			t.Fatalf("round %d: %d live admin keys, want 1", round, live)
		}
	}
}

// SetKeyLimits changes a live key's ceilings, which the key's next
// Authenticate returns (the cache is not stale); revoked and unknown keys
// and negative limits are refused.
func TestSetKeyLimits(t *testing.T) { eachBackend(t, testSetKeyLimits) }

func testSetKeyLimits(t *testing.T, b backend) {
	s, _ := b.openTest(t)
	ctx := context.Background()
	k, secret, err := s.CreateKeyLimits(ctx, "k", 2, KeyLimits{Pids: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, secret); err != nil { // cached now (SQLite)
		t.Fatal(err)
	}
	lim := KeyLimits{MemoryBytes: 64 << 20, CPUs: 0.5, TimeoutSeconds: 60}
	got, err := s.SetKeyLimits(ctx, k.ID, 3, lim)
	if err != nil || got.MaxSandboxes != 3 || got.Limits != lim {
		t.Fatalf("SetKeyLimits = %+v, %v", got, err)
	}
	if a, err := s.Authenticate(ctx, secret); err != nil || a.MaxSandboxes != 3 || a.Limits != lim {
		t.Fatalf("Authenticate after SetKeyLimits = %+v, %v (stale cache?)", a, err)
	}
	if _, err := s.SetKeyLimits(ctx, k.ID, -1, lim); err == nil {
		t.Error("negative sandbox cap accepted")
	}
	if _, err := s.SetKeyLimits(ctx, k.ID, 1, KeyLimits{Pids: -1}); err == nil {
		t.Error("negative limit accepted")
	}
	if _, err := s.SetKeyLimits(ctx, "key_0000000000000000", 1, lim); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown key: %v", err)
	}
	if err := s.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetKeyLimits(ctx, k.ID, 1, lim); !errors.Is(err, ErrNotFound) {
		t.Errorf("revoked key: %v", err)
	}
	if _, err := s.Authenticate(ctx, secret); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("revoked key authenticates after SetKeyLimits: %v", err)
	}
}

// Keys made before admin keys existed (schema without the column) are not
// admins after the migration, on both backends.
func TestAdminMigrationKeepsKeysNonAdmin(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		dir := filepath.Join(t.TempDir(), "state")
		ctx := context.Background()
		// The schema before admin keys, made by the migrations of then.
		oldLite, oldPG := migrations, pgMigrations
		migrations, pgMigrations = migrations[:2], pgMigrations[:6]
		var db *sql.DB
		var err error
		if b.url != "" {
			db, _, err = openPG(ctx, b.url)
		} else if err = os.MkdirAll(dir, 0o700); err == nil {
			if db, err = sql.Open("sqlite", filepath.Join(dir, DBFile)); err == nil {
				err = migrate(ctx, db)
			}
		}
		migrations, pgMigrations = oldLite, oldPG
		if err != nil {
			t.Fatal(err)
		}
		q := `INSERT INTO api_keys (id, name, hash, created_at) VALUES (?, ?, ?, ?)`
		if b.url != "" {
			q = `INSERT INTO api_keys (id, name, hash, created_at) VALUES ($1, $2, $3, $4)`
		}
		_, err = db.ExecContext(ctx, q, "key_00000000000000aa", "old", []byte("0123456789abcdef0123456789abcdef"), int64(1))
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		s, err := b.open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		k, err := s.GetKey(ctx, "key_00000000000000aa")
		if err != nil || k.Admin {
			t.Fatalf("a key from before the migration: %+v, %v; want a non-admin key", k, err)
		}
	})
}
