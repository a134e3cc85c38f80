package server_test

import (
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestE2EGVisorImageSnapshotForks: a gvisor sandbox with an image root is
// memory-snapshotted and forked. Each fork starts with the original's root
// as it was at the snapshot (a file written in /workspace and one in /opt,
// a file of the image deleted), its Python variable and its background
// process; what the original writes after the snapshot is not in the
// forks, and what one fork writes is in neither the other nor the
// original: no writable layer is shared. The forks keep their roots after
// the original (with its snapshot images) is killed. A fork taken over
// running after a SIGKILL of the server is snapshotted and forked in turn.
// A sandbox with a volume is refused with 422 naming
// memory_snapshot_volumes. Killed, nothing of any of them is left.
func TestE2EGVisorImageSnapshotForks(t *testing.T) {
	needRoot(t)
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	reg := it.Registry(t)
	ref := it.Push(t, reg, "forks/debian:12", it.DebianPython(t))
	state := stateDir(t)
	key := newKey(t, state, "imgfork")
	s := startServer(t, state, "--image-registry", reg)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	if code, v := post(t, s.URL+"/v1/images", key, `{"ref":"`+ref+`"}`); code != 200 {
		t.Fatalf("pull: %d %v", code, v)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Image: ref, User: "root", Timeout: 900})
	if err != nil {
		t.Fatal(err)
	}
	sh := func(id, script string) string {
		t.Helper()
		res, err := c.Exec(ctx, id, client.ExecRequest{Shell: script, Timeout: 120})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %q: %+v %v", id, script, res, err)
		}
		return res.Stdout
	}
	sh(sb.ID, "echo orig > /workspace/kept.txt && mkdir -p /opt/app && echo orig-opt > /opt/app/state && echo l0 > /opt/l0.txt && rm /etc/debian_version /etc/issue")
	if res := runCell(t, c, sb.ID, client.CodeRequest{Code: "x = 41"}); res.Error != nil {
		t.Fatalf("cell: %+v", res.Error)
	}
	if _, err := c.Start(ctx, sb.ID, client.ExecRequest{Shell: "sleep 600", Tag: "bg"}); err != nil {
		t.Fatal(err)
	}
	snap, err := c.MemorySnapshot(ctx, sb.ID)
	if err != nil {
		t.Fatalf("memory snapshot of a gvisor image sandbox: %v", err)
	}
	const state0 = "orig\norig-opt\ngone\n"
	const check = "cat /workspace/kept.txt /opt/app/state; test -e /etc/debian_version && echo present || echo gone"
	if got := sh(sb.ID, check); got != state0 {
		t.Fatalf("the original after its snapshot: %q", got)
	}
	sh(sb.ID, "echo after > /workspace/kept.txt")

	var forks []string
	for i := 0; i < 2; i++ {
		f, err := c.Create(ctx, client.CreateRequest{Snapshot: snap.ID, Timeout: 900})
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
		forks = append(forks, f.ID)
		if got := sh(f.ID, check); got != state0 {
			t.Fatalf("fork %d's root: %q, want the snapshot's %q", i, got, state0)
		}
		if res := runCell(t, c, f.ID, client.CodeRequest{Code: "x + 1"}); res.Error != nil || res.Text != "42" {
			t.Fatalf("fork %d: Python variable: %+v", i, res)
		}
		if got := sh(f.ID, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -cx 'sleep 600 '"); got != "1\n" {
			t.Fatalf("fork %d: background process: %q sleep 600 running", i, got)
		}
	}
	sh(forks[0], "echo fork0 > /workspace/kept.txt && echo fork0-opt > /opt/app/state && echo new > /etc/debian_version")
	if got := sh(forks[1], check); got != state0 {
		t.Fatalf("fork 1 sees fork 0's writes: %q", got)
	}
	if got := sh(sb.ID, check); got != "after\norig-opt\ngone\n" {
		t.Fatalf("the original sees a fork's writes: %q", got)
	}
	// A fork's root committed to an image carries the snapshot's layer
	// (a file only the original wrote, a file of the image it deleted)
	// and the fork's own changes.
	if code, v := post(t, s.URL+"/v1/sandboxes/"+forks[0]+"/snapshot", key, `{"name":"forks/fork0:1"}`); code != 201 {
		t.Fatalf("image snapshot of a fork: %d %v", code, v)
	}
	fromFork, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Image: "forks/fork0:1", User: "root", Timeout: 900})
	if err != nil {
		t.Fatal(err)
	}
	if got := sh(fromFork.ID, "cat /workspace/kept.txt /opt/app/state /opt/l0.txt /etc/debian_version; test -e /etc/issue && echo issue || echo no-issue"); got != "fork0\nfork0-opt\nl0\nnew\nno-issue\n" {
		t.Fatalf("a sandbox from the fork's image: %q", got)
	}
	if err := c.Kill(ctx, fromFork.ID); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", s.URL+"/v1/images", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	list, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(list), "forks/fork0:1") || strings.Contains(string(list), "-layer-") {
		t.Fatalf("images: %d %s, want the fork's image and none of the commit's intermediate ones", resp.StatusCode, list)
	}

	// A sandbox with a volume: refused, naming the capability.
	if code, v := post(t, s.URL+"/v1/volumes", key, `{"name":"v","size_bytes":16777216}`); code != 201 {
		t.Fatalf("volume: %d %v", code, v)
	}
	vs, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Volumes: []client.VolumeRef{{Name: "v", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	var ae *client.Error
	if _, err := c.MemorySnapshot(ctx, vs.ID); !errors.As(err, &ae) || ae.Status != 422 || !strings.Contains(ae.Message, "memory_snapshot_volumes") {
		t.Fatalf("memory snapshot of a gvisor sandbox with a volume: %v, want 422 naming memory_snapshot_volumes", err)
	}
	c.Kill(ctx, vs.ID)

	// The original goes, with its snapshot: the forks keep their roots.
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the original's state directory removed", func() bool {
		_, err := os.Stat(filepath.Join(state, "sandboxes", sb.ID))
		return os.IsNotExist(err)
	})
	if got := sh(forks[1], check+"; ls /usr/bin/python3"); got != state0+"/usr/bin/python3\n" {
		t.Fatalf("fork 1 after the original was killed: %q", got)
	}
	const fork0 = "fork0\nfork0-opt\npresent\n"
	if got := sh(forks[0], check); got != fork0 {
		t.Fatalf("fork 0 after the original was killed: %q", got)
	}

	// After a SIGKILL of the server, fork 0 (taken over running, its root
	// two layers and an upper above its image) is snapshotted and forked
	// again: the new fork has fork 0's root and variable.
	s.crash()
	s = startServer(t, state, "--image-registry", reg)
	c = client.New(s.URL, key)
	snap2, err := c.MemorySnapshot(ctx, forks[0])
	if err != nil {
		t.Fatalf("memory snapshot of an adopted fork: %v", err)
	}
	ff, err := c.Create(ctx, client.CreateRequest{Snapshot: snap2.ID, Timeout: 900})
	if err != nil {
		t.Fatalf("fork of an adopted fork: %v", err)
	}
	forks = append(forks, ff.ID)
	if got := sh(ff.ID, check); got != fork0 {
		t.Fatalf("the fork of fork 0: %q, want %q", got, fork0)
	}
	if res := runCell(t, c, ff.ID, client.CodeRequest{Code: "x + 1"}); res.Error != nil || res.Text != "42" {
		t.Fatalf("the fork of fork 0: Python variable: %+v", res)
	}
	for _, f := range forks {
		if err := c.Kill(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "no process of the sandboxes left", func() bool {
		return !hostHasArg(sb.ID) && !hostHasArg(forks[0]) && !hostHasArg(forks[1]) && !hostHasArg(forks[2])
	})
	for _, id := range append([]string{sb.ID, vs.ID}, forks...) {
		for _, p := range []string{filepath.Join(gvisor.StateBase, "bundles", id), filepath.Join(state, "sandboxes", id)} {
			eventually(t, 30*time.Second, "nothing left at "+p, func() bool { m, _ := filepath.Glob(p); return len(m) == 0 })
		}
	}
}
