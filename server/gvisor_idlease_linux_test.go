package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/native/idrange"
	"github.com/airlock-dev/airlock/store"
)

// uidBase reads a sandbox's host id range base from the server's store.
func uidBase(t *testing.T, state, id string) int {
	t.Helper()
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rec.UIDBase
}

// TestGVisorPausedKeepsIDRange (hostile): host id ranges are leased
// machine-wide, and a gVisor sandbox's host processes do not span its
// life: a pause (checkpoint) ends its runsc, a resume starts another. Its
// range must stay its own meanwhile. Two servers on one machine: the first
// pauses a gVisor sandbox and is killed with SIGKILL; the second starts
// (reaping leases of dead holders) and creates sandboxes; the first
// restarts and adopts its paused sandbox, which resumes with its files and
// Python session. The paused sandbox's lease is never reaped and no two
// live sandboxes share a range. On the old code the lease was held by the
// checkpointed runsc's pid, so the second server reaped it and could hand
// the range to another tenant's sandbox.
func TestGVisorPausedKeepsIDRange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("host id ranges are leased only as root")
	}
	state1, key1, s1, sb := gvisorSandbox(t)
	c1 := client.New(s1.URL, key1)
	ctx := ctxT(t)
	seedKept(ctx, t, c1, sb.ID)
	if _, err := c1.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	base := uidBase(t, state1, sb.ID)
	if base <= 0 {
		t.Fatalf("sandbox %s has no host id range", sb.ID)
	}
	lease := filepath.Join(idrange.DefaultDir, strconv.Itoa(base))
	s1.crash()

	state2 := stateDir(t)
	key2 := newKey(t, state2, "other-tenant")
	s2 := startServer(t, state2) // reaps the leases of dead holders
	if _, err := os.Stat(lease); err != nil {
		t.Fatalf("the paused sandbox's lease %s was reaped by another server's start: %v", lease, err)
	}
	c2 := client.New(s2.URL, key2)
	var others []string
	for range 3 {
		o, err := c2.Create(ctx, client.CreateRequest{Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, o.ID)
		if b := uidBase(t, state2, o.ID); b == base {
			t.Fatalf("another server's sandbox %s got host ids %d, those of the paused sandbox %s", o.ID, b, sb.ID)
		}
	}

	s1 = startServer(t, state1)
	c1 = client.New(s1.URL, key1)
	got, err := c1.Get(ctx, sb.ID)
	if err != nil || got.State != "running" || !got.Paused || !got.Reattached {
		t.Fatalf("after the restart the paused sandbox is %+v (%v), want it kept, paused", got, err)
	}
	if _, err := c1.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume after restart: %v", err)
	}
	checkKept(ctx, t, c1, sb.ID, "after the restart")
	// Resumed (a new runsc), its range is still held: no other server's
	// start frees it.
	s3 := startServer(t, stateDir(t))
	s3.stop(t)
	if _, err := os.Stat(lease); err != nil {
		t.Fatalf("the resumed sandbox's lease %s was reaped: %v", lease, err)
	}
	for _, id := range others {
		if b := uidBase(t, state2, id); b == base {
			t.Fatalf("sandbox %s of another server shares host ids %d with %s", id, b, sb.ID)
		}
	}
	if err := c1.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the killed sandbox's lease is freed", func() bool {
		b, err := os.ReadFile(lease)
		return os.IsNotExist(err) || !strings.Contains(string(b), sb.ID)
	})
}
