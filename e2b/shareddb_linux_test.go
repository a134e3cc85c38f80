package e2b

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-dev/airlock/internal/pgtest"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/store"
)

// Replicas sharing a database (serve --database-url) derive the same
// sandbox tokens, so a token one issued works on every one: the key lives
// in the database, not in a state directory's e2b.key.
func TestTokensSharedAcrossReplicas(t *testing.T) {
	c, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	url := c.NewDatabase(t)
	var hs []*Handler
	for range 2 {
		dir, err := os.MkdirTemp("", "al")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		st, err := store.OpenOptions(dir, store.Options{DatabaseURL: url})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		m, err := manager.Open(manager.Config{StateDir: dir, Store: st, AgentBinary: "/nonexistent/airlock", Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		h, err := NewHandler(Config{Manager: m, Store: st})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, "e2b.key")); !os.IsNotExist(err) {
			t.Errorf("a replica on a shared database wrote its own e2b.key (%v)", err)
		}
		hs = append(hs, h)
	}
	if hs[0].envdToken("sb-1") != hs[1].envdToken("sb-1") || hs[0].trafficToken("sb-1") != hs[1].trafficToken("sb-1") {
		t.Error("two replicas on one database derive different tokens for one sandbox")
	}
	if hs[0].envdToken("sb-1") == hs[1].envdToken("sb-2") {
		t.Error("tokens do not depend on the sandbox")
	}
}
