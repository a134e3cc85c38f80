package server_test

import (
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// TestVolumesUnmountedOnStop: a clean stop of the server (SIGTERM) leaves
// no volume mounted on the host and no loop device on its disk, where a
// volume used to stay mounted from its first use until deleted; the next
// server mounts it again with its data. With --keep-on-shutdown the volume
// of a sandbox left running stays mounted under it, and goes at the next
// clean stop once that sandbox is killed.
func TestVolumesUnmountedOnStop(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	s1 := startServer(t, state)
	key := newKey(t, state, "vol")
	ctx := ctxT(t)
	c := client.New(s1.URL, key)
	if _, err := c.CreateVolume(ctx, "keep", 64<<20); err != nil {
		t.Fatal(err)
	}
	withVolume := client.CreateRequest{Volumes: []client.VolumeRef{{Name: "keep", Path: "/data"}}}
	sb, err := c.Create(ctx, withVolume)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "echo kept > /data/f"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("write to the volume: %+v %v", res, err)
	}
	s1.stop(t)
	noLeftovers(t, state)

	s2 := startServer(t, state, "--keep-on-shutdown")
	c = client.New(s2.URL, key)
	sb, err = c.Create(ctx, withVolume)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"cat", "/data/f"}}); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("the volume under the next server: %+v %v", res, err)
	}
	s2.stop(t)
	if left := strings.Join(volumeMounts(state), "\n"); left == "" {
		t.Fatal("--keep-on-shutdown: the volume of the sandbox left running was unmounted")
	}

	s3 := startServer(t, state)
	c = client.New(s3.URL, key)
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"cat", "/data/f"}}); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("the kept sandbox's volume after the restart: %+v %v", res, err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s3.stop(t)
	noLeftovers(t, state)
}

// volumeMounts lists the mount points of state's volumes.
func volumeMounts(state string) []string {
	var out []string
	for _, l := range testserver.HostLeftovers(state) {
		if strings.HasPrefix(l, "mount ") && strings.Contains(l, "/volumes/") {
			out = append(out, l)
		}
	}
	return out
}
