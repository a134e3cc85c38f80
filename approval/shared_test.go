package approval_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/internal/pgtest"
	"github.com/airlock-dev/airlock/store"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// sharedGates returns gates of n servers sharing one new database, made
// with cfg plus the database as their SandboxPolicies and PendingStore.
func sharedGates(t *testing.T, c *pgtest.Cluster, n int, cfg approval.Config) []*approval.Gate {
	t.Helper()
	url := c.NewDatabase(t)
	var gates []*approval.Gate
	for range n {
		st, err := store.OpenOptions(t.TempDir(), store.Options{DatabaseURL: url})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		cfg := cfg
		cfg.SandboxPolicies, cfg.PendingStore = st, st
		cfg.Audit = func(context.Context, string, string, string, any) error { return nil }
		g, err := approval.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		gates = append(gates, g)
	}
	return gates
}

// A request held on one server is listed by another and decided by an
// answer given there; the first answer wins, and an unknown id is
// ErrNotFound everywhere.
func TestPendingApprovalSharedAcrossServers(t *testing.T) {
	pol, err := approval.Parse([]byte(`{"require":[{"action":"exec","argv":"^deploy","reason":"deploys"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	gates := sharedGates(t, pgtest.Shared(t), 2, approval.Config{Policy: pol, Timeout: time.Minute})
	a, b := gates[0], gates[1]
	ctx := context.Background()
	for _, tc := range []struct {
		decision string
		ok       bool
	}{{approval.Approve, true}, {approval.Deny, false}} {
		act := approval.Action{Kind: approval.KindExec, Owner: "key_a", Sandbox: "sb-1", Argv: []string{"deploy", tc.decision}}
		done := make(chan error, 1)
		go func() { done <- a.Check(ctx, act, nil) }()
		var id string
		deadline := time.Now().Add(30 * time.Second)
		for id == "" {
			for _, p := range b.List(func(*approval.Pending) bool { return true }) {
				if p.Action.Argv[1] == tc.decision {
					id = p.ID
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("the other server never lists the pending approval")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if p, ok := b.Get(id); !ok || p.Summary == "" || p.Action.Owner != "key_a" {
			t.Fatalf("Get on the other server = %+v, %v", p, ok)
		}
		if err := b.Answer(id, approval.Decision{Decision: tc.decision, By: "key:human"}); err != nil {
			t.Fatalf("answer on the other server: %v", err)
		}
		err := <-done
		var ae *approval.Error
		switch {
		case tc.ok && err != nil:
			t.Errorf("approved on the other server, Check = %v", err)
		case !tc.ok && (!errors.As(err, &ae) || ae.Code != approval.CodeDenied || !strings.Contains(ae.Msg, "key:human")):
			t.Errorf("denied on the other server, Check = %v", err)
		}
		if err := a.Answer(id, approval.Decision{Decision: approval.Approve, By: "key:late"}); !errors.Is(err, approval.ErrNotFound) {
			t.Errorf("second answer: %v, want ErrNotFound", err)
		}
		if _, ok := b.Get(id); ok {
			t.Error("a decided approval is still pending")
		}
	}
	if err := b.Answer("apr_nope", approval.Decision{Decision: approval.Approve}); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("unknown approval: %v", err)
	}
}

// Two servers sharing a database (serve --database-url): a sandbox's own
// rules, given to the server that created it, hold on the other one too;
// with the database down an uncached sandbox's check is refused.
func TestSandboxPolicySharedAcrossServers(t *testing.T) {
	c, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	gates := sharedGates(t, c, 2, approval.Config{})
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
