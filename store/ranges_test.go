package store

import (
	"context"
	"testing"
)

// Each sandbox records its host id range; only running sandboxes hold one.
func TestLiveUIDBases(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	for i, st := range []string{StateRunning, StateRunning, StateLost, StateKilled} {
		sb := &Sandbox{ID: "sb-" + string(rune('a'+i)), State: st, UIDBase: 1_500_000_000 + i*65536}
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.GetSandbox(ctx, "sb-b")
	if err != nil {
		t.Fatal(err)
	}
	if got.UIDBase != 1_500_065536 {
		t.Fatalf("uid base read back %d", got.UIDBase)
	}
	live, err := s.LiveUIDBases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 2 || !live[1_500_000_000] || !live[1_500_065536] {
		t.Fatalf("live ranges %v, want the two running sandboxes' only", live)
	}
}

// Per-key ceilings survive a round trip and reject negatives.
func TestKeyLimits(t *testing.T) { eachBackend(t, testKeyLimits) }

func testKeyLimits(t *testing.T, b backend) {
	s, _ := b.openTest(t)
	ctx := context.Background()
	lim := KeyLimits{MemoryBytes: 1 << 30, CPUs: 1.5, Pids: 64, DiskBytes: 1 << 28, TimeoutSeconds: 600}
	k, secret, err := s.CreateKeyLimits(ctx, "capped", 2, lim)
	if err != nil {
		t.Fatal(err)
	}
	for _, get := range []func() (*APIKey, error){
		func() (*APIKey, error) { return s.GetKey(ctx, k.ID) },
		func() (*APIKey, error) { return s.Authenticate(ctx, secret) },
	} {
		got, err := get()
		if err != nil {
			t.Fatal(err)
		}
		if got.Limits != lim || got.MaxSandboxes != 2 {
			t.Fatalf("limits read back %+v, want %+v", got.Limits, lim)
		}
	}
	if _, _, err := s.CreateKeyLimits(ctx, "bad", 0, KeyLimits{Pids: -1}); err == nil {
		t.Fatal("negative key limit accepted")
	}
	plain, _, err := s.CreateKey(ctx, "plain", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetKey(ctx, plain.ID); got.Limits != (KeyLimits{}) {
		t.Fatalf("plain key has limits %+v", got.Limits)
	}
}
