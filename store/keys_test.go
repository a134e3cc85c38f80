package store

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestKeyLifecycle(t *testing.T) { eachBackend(t, testKeyLifecycle) }

func testKeyLifecycle(t *testing.T, b backend) {
	s, _ := b.openTest(t)
	ctx := context.Background()
	key, secret, err := s.CreateKey(ctx, "laptop", 5)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, "al_") || len(secret) != 46 || strings.ContainsAny(secret, "+/=") {
		t.Errorf("secret %q is not al_ + unpadded base64url of 32 bytes", secret)
	}
	if !strings.HasPrefix(key.ID, "key_") || key.Name != "laptop" || key.MaxSandboxes != 5 ||
		key.RevokedAt != nil || key.CreatedAt.IsZero() {
		t.Errorf("created key = %+v", key)
	}

	// The secret itself is not stored anywhere; only its SHA-256 is.
	var n int
	if err := s.kr.QueryRow(s.q(`SELECT COUNT(*) FROM api_keys WHERE CAST(hash AS TEXT) = ? OR name = ? OR id = ?`),
		secret, secret, secret).Scan(&n); err != nil || n != 0 {
		t.Errorf("secret found in api_keys (n=%d, err=%v)", n, err)
	}
	h := sha256.Sum256([]byte(secret))
	if err := s.kr.QueryRow(s.q(`SELECT COUNT(*) FROM api_keys WHERE hash = ?`), h[:]).Scan(&n); err != nil || n != 1 {
		t.Errorf("hash not stored (n=%d, err=%v)", n, err)
	}

	got, err := s.Authenticate(ctx, secret)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != key.ID || got.MaxSandboxes != 5 {
		t.Errorf("Authenticate = %+v, want %+v", got, key)
	}
	// Cached path, and the copy is the caller's own.
	got.Name = "mutated"
	got2, err := s.Authenticate(ctx, secret)
	if err != nil || got2.Name != "laptop" {
		t.Errorf("second Authenticate = %+v, %v", got2, err)
	}

	// Wrong secrets of every shape.
	other := "al_" + strings.Repeat("A", 43)
	flipped := secret[:10] + string(secret[10]^1) + secret[11:]
	for _, bad := range []string{"", "al_", secret + "x", secret[:45], "xx" + secret[2:], other, flipped,
		strings.Replace(secret, secret[5:6], "+", 1), " " + secret[1:]} {
		if k, err := s.Authenticate(ctx, bad); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("Authenticate(%q) = %v, %v; want ErrUnauthorized", bad, k, err)
		}
	}

	key2, secret2, err := s.CreateKey(ctx, "ci", 0)
	if err != nil {
		t.Fatal(err)
	}
	if secret2 == secret || key2.ID == key.ID {
		t.Error("two keys share a secret or an ID")
	}
	keys, err := s.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0].ID != key.ID || keys[1].ID != key2.ID {
		t.Errorf("ListKeys = %+v", keys)
	}

	// Revoke: takes effect at once despite the cache.
	if err := s.RevokeKey(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, secret); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("revoked key authenticated: %v", err)
	}
	if _, err := s.Authenticate(ctx, secret2); err != nil {
		t.Errorf("other key stopped working: %v", err)
	}
	k, err := s.GetKey(ctx, key.ID)
	if err != nil || k.RevokedAt == nil {
		t.Fatalf("GetKey after revoke = %+v, %v", k, err)
	}
	first := *k.RevokedAt
	if err := s.RevokeKey(ctx, key.ID); err != nil {
		t.Errorf("second revoke: %v", err)
	}
	if k, _ = s.GetKey(ctx, key.ID); !k.RevokedAt.Equal(first) {
		t.Errorf("second revoke moved RevokedAt from %v to %v", first, k.RevokedAt)
	}
	if err := s.RevokeKey(ctx, "key_nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("RevokeKey(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.GetKey(ctx, "key_nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetKey(unknown) = %v, want ErrNotFound", err)
	}
	if keys, _ = s.ListKeys(ctx); len(keys) != 2 || keys[0].RevokedAt == nil || keys[1].RevokedAt != nil {
		t.Errorf("ListKeys after revoke = %+v", keys)
	}
	if _, _, err := s.CreateKey(ctx, "neg", -1); err == nil {
		t.Error("negative limit accepted")
	}
}

func TestRevokeFromOtherProcess(t *testing.T) {
	// A revocation through another Store on the same directory (e.g.
	// "airlock keys revoke" while the server runs) is seen at once, through
	// RevokedFile; a revocation written into the database directly is seen
	// once the cache entry's TTL passes.
	s, dir := openTest(t)
	ctx := context.Background()
	key, secret, err := s.CreateKey(ctx, "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	key2, secret2, err := s.CreateKey(ctx, "k2", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range []string{secret, secret2} {
		if _, err := s.Authenticate(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}
	other, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.RevokeKey(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, secret); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("key revoked by another Store still authenticates: %v", err)
	}
	if _, err := s.Authenticate(ctx, secret2); err != nil {
		t.Fatalf("the other key: %v", err)
	}
	if err := rawExec(t, other.w, `UPDATE api_keys SET revoked_at = 1 WHERE id = ?`, key2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, secret2); err != nil {
		t.Errorf("expected the cached key to live until its TTL after a direct database edit, got %v", err)
	}
	s.keyMu.Lock()
	s.keyTTL = time.Millisecond
	s.keyMu.Unlock()
	time.Sleep(2 * time.Millisecond)
	if _, err := s.Authenticate(ctx, secret2); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("key revoked in the database still authenticates after TTL: %v", err)
	}
	s.keyMu.RLock()
	n := len(s.keyCache)
	s.keyMu.RUnlock()
	if n != 0 {
		t.Errorf("revoked key still cached (%d entries)", n)
	}
}

func TestRevokeRacesAuthenticate(t *testing.T) { eachBackend(t, testRevokeRacesAuthenticate) }

func testRevokeRacesAuthenticate(t *testing.T, b backend) {
	// However Authenticate and RevokeKey interleave, once RevokeKey has
	// returned the key must never authenticate again.
	s, _ := b.openTest(t)
	ctx := context.Background()
	rounds := 20
	if b.url != "" {
		rounds = 5 // no cache to race: fewer rounds say as much
	}
	for range rounds {
		key, secret, err := s.CreateKey(ctx, "race", 0)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 8 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
						s.Authenticate(ctx, secret)
					}
				}
			})
		}
		time.Sleep(time.Millisecond)
		if err := s.RevokeKey(ctx, key.ID); err != nil {
			t.Fatal(err)
		}
		for range 100 {
			if _, err := s.Authenticate(ctx, secret); err == nil {
				t.Fatal("revoked key authenticated after RevokeKey returned")
			}
		}
		close(stop)
		wg.Wait()
		if _, err := s.Authenticate(ctx, secret); err == nil {
			t.Fatal("revoked key authenticated after RevokeKey returned")
		}
	}
}
