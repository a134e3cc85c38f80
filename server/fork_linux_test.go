package server_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// TestE2EGVisorSnapshotForks: a snapshot of a running gvisor sandbox
// leaves it running; three sandboxes created from the snapshot each start
// with the original's workspace file and Python variable and then diverge
// (each writes its own value and reads back only its own), as does the
// original. The images are under the original's state directory and go
// with it: after it is killed the snapshot is unknown (404). A native
// sandbox cannot be snapshotted (422), an unknown snapshot is a 404, and
// another key cannot fork someone else's snapshot.
func TestE2EGVisorSnapshotForks(t *testing.T) {
	state, key, s, sb := gvisorSandbox(t)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	if _, err := c.WriteFile(ctx, sb.ID, "f.txt", strings.NewReader("base"), 0); err != nil {
		t.Fatal(err)
	}
	if res := runCell(t, c, sb.ID, client.CodeRequest{Code: "v = 'base'"}); res.Error != nil {
		t.Fatalf("cell: %+v", res.Error)
	}
	snap, err := c.MemorySnapshot(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if snap.SandboxID != sb.ID || snap.SizeBytes <= 0 || !strings.HasPrefix(snap.ID, "snap-") {
		t.Fatalf("snapshot %+v", snap)
	}
	if m, _ := filepath.Glob(filepath.Join(state, "sandboxes", sb.ID, "snapshots", snap.ID, "*")); len(m) == 0 {
		t.Fatalf("no image under the sandbox's state directory")
	}
	ids := []string{sb.ID}
	for i := 0; i < 3; i++ {
		f, err := c.Create(ctx, client.CreateRequest{Snapshot: snap.ID, Timeout: 600})
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
		if f.Runtime != "gvisor" {
			t.Fatalf("fork %d runs under %q", i, f.Runtime)
		}
		ids = append(ids, f.ID)
	}
	diverge(t, c, ids)

	other := client.New(s.URL, newKey(t, state, "other"))
	var ae *client.Error
	if _, err := other.Create(ctx, client.CreateRequest{Snapshot: snap.ID}); !errors.As(err, &ae) || ae.Status != 404 {
		t.Fatalf("another key forks the snapshot: %v", err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Snapshot: "snap-0000000000000000"}); !errors.As(err, &ae) || ae.Status != 404 {
		t.Fatalf("unknown snapshot: %v", err)
	}
	nat, err := c.Create(ctx, client.CreateRequest{Runtime: "native"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.MemorySnapshot(ctx, nat.ID); !errors.As(err, &ae) || ae.Status != 422 || !strings.Contains(ae.Message, "gvisor") {
		t.Fatalf("snapshot of a native sandbox: %v", err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Snapshot: snap.ID}); !errors.As(err, &ae) || ae.Status != 404 {
		t.Fatalf("fork of a killed sandbox's snapshot: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(state, "sandboxes", sb.ID)); len(m) > 0 {
		t.Fatalf("the killed sandbox's state directory (with its snapshot) is left: %v", m)
	}
}

// TestE2EGVisorSnapshotQuota: once the snapshot images use the server's
// --snapshot-quota, the next snapshot is refused (429) naming the quota.
func TestE2EGVisorSnapshotQuota(t *testing.T) {
	_, key, s, sb := gvisorSandbox(t, "--snapshot-quota", "1")
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	if _, err := c.MemorySnapshot(ctx, sb.ID); err != nil {
		t.Fatalf("first snapshot, within the quota: %v", err)
	}
	var ae *client.Error
	if _, err := c.MemorySnapshot(ctx, sb.ID); !errors.As(err, &ae) || ae.Status != 429 || !strings.Contains(ae.Message, "snapshot-quota") {
		t.Fatalf("snapshot over the quota: %v", err)
	}
}

// TestE2EGVisorSnapshotSurvivesRestart: a snapshot outlives a server
// killed with SIGKILL. Its sandbox, paused before the kill, is taken over
// by the restarted server, which reloads the snapshot from its manifest:
// a fork of it starts with the original's file and Python variable, and
// then the fork and the resumed original diverge. The reloaded image still
// counts against --snapshot-quota, and it goes with its sandbox.
func TestE2EGVisorSnapshotSurvivesRestart(t *testing.T) {
	state, key, s1, sb := gvisorSandbox(t, "--snapshot-quota", "1")
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	if _, err := c.WriteFile(ctx, sb.ID, "f.txt", strings.NewReader("base"), 0); err != nil {
		t.Fatal(err)
	}
	if res := runCell(t, c, sb.ID, client.CodeRequest{Code: "v = 'base'"}); res.Error != nil {
		t.Fatalf("cell: %+v", res.Error)
	}
	snap, err := c.MemorySnapshot(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(state, "sandboxes", sb.ID, "snapshots", snap.ID+".json"))
	if err != nil {
		t.Fatalf("no manifest next to the image: %v", err)
	}
	var mf struct {
		ID, SandboxID, Owner string
		SizeBytes            int64     `json:"size_bytes"`
		CreatedAt            time.Time `json:"created_at"`
	}
	if err := json.Unmarshal(data, &mf); err != nil || mf.ID != snap.ID || mf.Owner == "" || mf.SizeBytes != snap.SizeBytes || mf.CreatedAt.IsZero() {
		t.Fatalf("manifest %s: %+v %v", data, mf, err)
	}
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s1.crash() // SIGKILL

	s2 := startServer(t, state, "--snapshot-quota", "1")
	c = client.New(s2.URL, key)
	f, err := c.Create(ctx, client.CreateRequest{Snapshot: snap.ID, Timeout: 600})
	if err != nil {
		t.Fatalf("fork after restart: %v", err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume the original: %v", err)
	}
	diverge(t, c, []string{sb.ID, f.ID})
	var ae *client.Error
	if _, err := c.MemorySnapshot(ctx, sb.ID); !errors.As(err, &ae) || ae.Status != 429 {
		t.Fatalf("snapshot over the quota the reloaded one uses: %v", err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Snapshot: snap.ID}); !errors.As(err, &ae) || ae.Status != 404 {
		t.Fatalf("fork of a killed sandbox's snapshot: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(state, "sandboxes", sb.ID)); len(m) > 0 {
		t.Fatalf("the killed sandbox's state directory (with its snapshot) is left: %v", m)
	}
}

// diverge checks that the sandboxes ids, forks of one snapshot (or its
// original), start with its workspace file f.txt and Python variable v
// both "base", and then each keeps its own values.
func diverge(t *testing.T, c *client.Client, ids []string) {
	t.Helper()
	ctx := ctxT(t)
	for i, id := range ids {
		if res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"cat", "f.txt"}}); err != nil || res.Stdout != "base" {
			t.Fatalf("sandbox %d (%s) before diverging: %+v %v", i, id, res, err)
		}
		if res := runCell(t, c, id, client.CodeRequest{Code: "v"}); res.Error != nil || res.Text != "'base'" {
			t.Fatalf("sandbox %d Python variable before diverging: %+v", i, res)
		}
		own := fmt.Sprintf("own-%d", i)
		if _, err := c.WriteFile(ctx, id, "f.txt", strings.NewReader(own), 0); err != nil {
			t.Fatal(err)
		}
		if res := runCell(t, c, id, client.CodeRequest{Code: fmt.Sprintf("v = %q", own)}); res.Error != nil {
			t.Fatalf("cell: %+v", res.Error)
		}
	}
	for i, id := range ids {
		own := fmt.Sprintf("own-%d", i)
		if res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"cat", "f.txt"}}); err != nil || res.Stdout != own {
			t.Fatalf("sandbox %d file after diverging: %+v %v, want %q", i, res, err, own)
		}
		if res := runCell(t, c, id, client.CodeRequest{Code: "v"}); res.Error != nil || res.Text != fmt.Sprintf("'%s'", own) {
			t.Fatalf("sandbox %d Python variable after diverging: %+v, want %q", i, res, own)
		}
	}
}
