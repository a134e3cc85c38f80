package store

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// TestSetSandboxPolicy: a running sandbox's policy is replaced; an ended
// one keeps its policy (ErrEnded), an unknown one is ErrNotFound, invalid
// JSON is refused.
func TestSetSandboxPolicy(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	sb := testSandbox("sb-pol")
	if err := s.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	want := json.RawMessage(`{"network":{"mode":"allowlist","allow":["pypi.org"]}}`)
	if err := s.SetSandboxPolicy(ctx, sb.ID, want); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Policy) != string(want) {
		t.Fatalf("policy = %s, want %s", got.Policy, want)
	}
	if err := s.SetSandboxPolicy(ctx, sb.ID, json.RawMessage(`{not json`)); err == nil {
		t.Fatal("invalid JSON accepted")
	}
	if err := s.SetSandboxPolicy(ctx, "sb-none", want); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown sandbox: %v, want ErrNotFound", err)
	}
	if err := s.EndSandbox(ctx, sb.ID, StateKilled, "test", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSandboxPolicy(ctx, sb.ID, json.RawMessage(`{}`)); !errors.Is(err, ErrEnded) {
		t.Fatalf("ended sandbox: %v, want ErrEnded", err)
	}
	got, _ = s.GetSandbox(ctx, sb.ID)
	if string(got.Policy) != string(want) {
		t.Fatalf("ended sandbox's policy changed to %s", got.Policy)
	}
}
