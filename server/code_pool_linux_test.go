package server_test

import (
	"context"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/store"
)

// waitPool waits until the server's warm pool holds n ready sandboxes.
func waitPool(t testing.TB, c *client.Client, n int) {
	t.Helper()
	eventually(t, 60*time.Second, "the warm pool to fill", func() bool {
		info, err := c.Info(context.Background())
		return err == nil && info.PoolIdle >= n
	})
}

// TestPooledCreate: with --pool 2 --pool-python, creates are served from
// the pool (owner, metadata and TTL applied at hand-out, a warm Python
// context), the pool refills, and pool plus running never exceed
// --max-sandboxes (a create on a full server evicts a pooled sandbox).
func TestPooledCreate(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "alice")
	other := newKey(t, state, "bob")
	s := startServer(t, state, "--pool", "2", "--pool-python", "--max-sandboxes", "3")
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	waitPool(t, c, 2)
	// Pooled sandboxes warm at a background CPU weight (host side), so
	// that a refill does not slow the sandboxes in use.
	pooled := pooledIDs(t, state)
	if len(pooled) != 2 {
		t.Fatalf("pooled sandboxes in the store: %v, want 2", pooled)
	}
	for _, id := range pooled {
		if w, ok := cpuWeight(t, id); ok && w != 64 && w != 6 {
			t.Errorf("pooled sandbox %s: CPU weight %d, want the background weight (v1 shares 64, v2 weight 6)", id, w)
		}
	}

	sb, err := c.Create(ctx, client.CreateRequest{Metadata: map[string]string{"job": "pooled"}, Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	// Handed out: the default weight again.
	if w, ok := cpuWeight(t, sb.ID); ok && w != 1024 && w != 100 {
		t.Errorf("sandbox %s from the pool: CPU weight %d, want the default (v1 shares 1024, v2 weight 100)", sb.ID, w)
	}
	if sb.Metadata["job"] != "pooled" || sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) > 121*time.Second {
		t.Fatalf("pooled sandbox info: %+v", sb)
	}
	// The default context has numpy and pandas imported as np and pd, as
	// --pool-python says.
	res := runCell(t, c, sb.ID, client.CodeRequest{Code: "import sys\n('numpy' in sys.modules, 'pandas' in sys.modules, np.__name__, pd.__name__, 1 + 1)"})
	if res.Text != "(True, True, 'numpy', 'pandas', 2)" {
		t.Fatalf("warm python context: %+v", res)
	}
	// Owned by alice only.
	if _, err := client.New(s.URL, other).Get(ctx, sb.ID); client.StatusOf(err) != 404 {
		t.Fatalf("bob sees alice's pooled sandbox: %v", err)
	}
	list, err := c.List(ctx, nil)
	if err != nil || len(list) != 1 {
		t.Fatalf("alice's list: %+v %v", list, err)
	}
	waitPool(t, c, 2) // refilled: 1 running + 2 pooled = the limit

	// Custom limits cannot come from the pool; the full server evicts a
	// pooled sandbox to make room.
	sb2, err := c.Create(ctx, client.CreateRequest{Limits: &client.Limits{Pids: 100}})
	if err != nil {
		t.Fatalf("create on a full server with a pool: %v", err)
	}
	sb3, err := c.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{}); client.StatusOf(err) != 429 {
		t.Fatalf("fourth sandbox: %v", err)
	}
	for _, id := range []string{sb.ID, sb2.ID, sb3.ID} {
		if err := c.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	waitPool(t, c, 2)
}

// pooledIDs lists the ids of the warm pool's sandboxes from the server's
// store.
func pooledIDs(t testing.TB, state string) []string {
	t.Helper()
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.ListSandboxes(context.Background(), store.ListFilter{Owner: "\x00pool"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		if r.EndedAt == nil {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// cpuWeight reads a sandbox's CPU weight on the host: cgroup v1
// cpu.shares or v2 cpu.weight; false if the host has no cpu controller.
func cpuWeight(t testing.TB, id string) (int, bool) {
	t.Helper()
	for _, f := range []string{"/sys/fs/cgroup/cpu/airlock/" + id + "/cpu.shares", "/sys/fs/cgroup/airlock/" + id + "/cpu.weight"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		w, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %q", f, b)
		}
		return w, true
	}
	return 0, false
}

// BenchmarkPooledCreateFirstCell measures a create served from a warm pool
// (with a warm Python context) plus the first cell, 1 + 1, through the API.
func BenchmarkPooledCreateFirstCell(b *testing.B) {
	needRoot(b)
	state := stateDir(b)
	s := startServer(b, state, "--no-auth", "--pool", "2", "--pool-python")
	c := client.New(s.URL, "")
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		waitPool(b, c, 1)
		b.StartTimer()
		t0 := time.Now()
		sb, err := c.Create(ctx, client.CreateRequest{})
		if err != nil {
			b.Fatal(err)
		}
		res, err := c.RunCode(ctx, sb.ID, client.CodeRequest{Code: "1 + 1"})
		lat = append(lat, time.Since(t0))
		if err != nil || res.Text != "2" {
			b.Fatalf("%+v %v", res, err)
		}
		b.StopTimer()
		c.Kill(ctx, sb.ID)
		b.StartTimer()
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "median-ms")
}

// BenchmarkWarmCell measures the round trip of 1 + 1 in a warm Python
// context through the API.
func BenchmarkWarmCell(b *testing.B) {
	c, id := benchSandbox(b)
	ctx := context.Background()
	for range 3 {
		if _, err := c.RunCode(ctx, id, client.CodeRequest{Code: "1 + 1"}); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		res, err := c.RunCode(ctx, id, client.CodeRequest{Code: "1 + 1"})
		lat = append(lat, time.Since(t0))
		if err != nil || res.Text != "2" {
			b.Fatalf("%+v %v", res, err)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "median-ms")
}
