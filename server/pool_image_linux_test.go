package server_test

import (
	"archive/tar"
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/debimage"
	"github.com/airlock-dev/airlock/imagestore"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// storeArchive imports img into state's image store as name, in owner's
// namespace ("" the operator's), published when pub, as an operator does
// with `airlock image import [--key ID] --name NAME` (and `airlock image
// publish`), before a server on state starts.
func storeArchive(t *testing.T, state, owner, name string, img v1.Image, pub bool) {
	t.Helper()
	file := filepath.Join(t.TempDir(), name+".tar")
	if err := debimage.WriteArchive(img, name+":latest", file); err != nil {
		t.Fatal(err)
	}
	st, err := imagestore.Open(filepath.Join(state, "images"), imagestore.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	st = st.As(owner)
	if _, err := st.Import(context.Background(), file, name, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Publish(name, pub); err != nil {
		t.Fatal(err)
	}
}

// TestPooledImageCreate: with --pool 1 --pool-image NAME the server keeps
// a ready sandbox of the published image NAME besides the default one; a
// create naming the image and nothing else is served from that pool (its
// root is the image's), and creates that ask for more (limits, the root
// user), or name another image, or whose key has its own image of that
// name, get fresh sandboxes (of the image they mean). A pool
// image that is not a published image of the store is refused at start.
func TestPooledImageCreate(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	storeArchive(t, state, "", "pooled", it.Busybox(t), true)
	storeArchive(t, state, "", "private", it.Busybox(t), false)
	key := newKey(t, state, "alice")
	// Bob's own image of the same name, with other contents: the name
	// means that image for him, never the pooled one.
	bob := newKey(t, state, "bob")
	own, err := mutate.AppendLayers(it.Busybox(t), it.Layer(t, it.TarLayer(t,
		it.Entry{Name: "etc/image-marker", Type: tar.TypeReg, Mode: 0o644, Data: "bob's own image\n"})))
	if err != nil {
		t.Fatal(err)
	}
	storeArchive(t, state, keyID(t, state, "bob"), "pooled", own, false)
	for _, bad := range []string{"private", "missing"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, airlockBin(t), "serve", "--listen", "127.0.0.1:0", "--state-dir", state,
			"--pool", "1", "--pool-image", bad).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), `pool image "`+bad+`": not a published image`) {
			t.Fatalf("serve --pool-image %s: %v\n%s", bad, err, out)
		}
	}
	s := startServer(t, state, "--pool", "1", "--pool-image", "pooled", "--max-sandboxes", "6")
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	waitPool(t, c, 2) // one default, one of the image
	pooled := pooledIDs(t, state)
	if len(pooled) != 2 {
		t.Fatalf("pooled sandboxes in the store: %v, want 2", pooled)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Image: "pooled"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pooled, sb.ID) {
		t.Fatalf("create of the pooled image: %s, not one of the pool's %v", sb.ID, pooled)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /etc/image-marker"}})
	if err != nil || res.ExitCode != 0 || res.Stdout != "from the image\n" {
		t.Fatalf("the pooled image sandbox's root: %+v %v", res, err)
	}
	waitPool(t, c, 2)
	pooled = pooledIDs(t, state)
	bobs, err := client.New(s.URL, bob).Create(ctx, client.CreateRequest{Image: "pooled"})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(pooled, bobs.ID) {
		t.Fatalf("bob's create of his own image named pooled was served from the pool of the public one")
	}
	res, err = client.New(s.URL, bob).Exec(ctx, bobs.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /etc/image-marker"}})
	if err != nil || res.Stdout != "bob's own image\n" {
		t.Fatalf("bob's sandbox of his image: %+v %v", res, err)
	}
	for _, req := range []client.CreateRequest{
		{Image: "pooled", Limits: &client.Limits{Pids: 100}},
		{Image: "pooled", User: "root"},
	} {
		sb, err := c.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(pooled, sb.ID) {
			t.Fatalf("create %+v was served from the pool", req)
		}
		c.Kill(ctx, sb.ID)
	}
}
