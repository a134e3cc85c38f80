package approval_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"airlock/approval"
	"airlock/internal/pgtest"
	"airlock/store"
)

// Two servers sharing a database (serve --database-url): a sandbox's own
// rules, given to the server that created it, hold on the other one too;
// with the database down an uncached sandbox's check is refused.
func TestSandboxPolicySharedAcrossServers(t *testing.T) {
	c, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	url := c.NewDatabase(t)
	ctx := context.Background()
	var gates []*approval.Gate
	for range 2 {
		st, err := store.OpenOptions(t.TempDir(), store.Options{DatabaseURL: url})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		g, err := approval.New(approval.Config{SandboxPolicies: st,
			Audit: func(context.Context, string, string, string, any) error { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		gates = append(gates, g)
	}
	a, b := gates[0], gates[1]
	rm := approval.Action{Kind: approval.KindExec, Owner: "key_a", Sandbox: "sb-1", Argv: []string{"rm", "-rf", "/data"}}
	if err := b.Check(ctx, rm, nil); err != nil {
		t.Fatalf("no policy yet: %v", err)
	}
	p, err := approval.Parse([]byte(`{"deny":[{"action":"exec","argv":"^rm ","reason":"no rm here"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetSandboxPolicy("sb-1", p); err != nil {
		t.Fatal(err)
	}
	var ae *approval.Error
	if err := b.Check(ctx, rm, nil); !errors.As(err, &ae) || ae.Code != approval.CodeDenied || !strings.Contains(ae.Msg, "no rm here") {
		t.Fatalf("the other server let the sandbox's denied command run: %v", err)
	}
	other := rm
	other.Sandbox = "sb-2"
	if err := b.Check(ctx, other, nil); err != nil {
		t.Errorf("another sandbox is held by sb-1's rules: %v", err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx, other, nil); !errors.As(err, &ae) || ae.Code != approval.CodeDenied {
		t.Errorf("database down, check = %v, want refused", err)
	}
	if err := a.SetSandboxPolicy("sb-3", p); err == nil {
		t.Error("policy reported set with the database down")
	}
}
