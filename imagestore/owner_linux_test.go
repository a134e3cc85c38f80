package imagestore_test

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"airlock/imagestore"
	it "airlock/imagestore/imagetest"
)

// TestOwners: each owner (an API key id; "" the operator) has its own
// namespace of names. An entry of the old format (no owner annotation,
// as every image stored before owners) is the operator's: no key finds
// it, by name or digest, until published, and then may read but not
// remove or unpublish it. A key's pull of the same name is its own entry
// (the blobs shared); removing it leaves the operator's and the layers.
// A key's name over a public one shadows it for that key only, and the
// operator re-pulling its name replaces only its own entry, private again.
func TestOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (image files keep their owners)")
	}
	reg := it.Registry(t)
	ref := it.Push(t, reg, "owners/img:1", it.Image(t, it.TarLayer(t, it.Entry{Name: "etc/marker", Type: tar.TypeReg, Data: "m"})))
	op, dir := openStore(t, imagestore.Limits{})
	ctx := context.Background()
	img, err := op.Pull(ctx, ref, imagestore.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The operator's entry is exactly what the code before owners wrote.
	ix := readIndex(t, dir)
	if len(ix) != 1 || len(ix[0].Annotations) != 1 || ix[0].Annotations[imagestore.RefAnnotation] != ref {
		t.Fatalf("operator entry: %+v, want only the name annotation (the old format)", ix)
	}
	a, b, c := op.As("key_a"), op.As("key_b"), op.As("key_c")
	notFound := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, imagestore.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", what, err)
		}
	}
	hex := strings.TrimPrefix(img.Digest, "sha256:")
	for _, r := range []string{ref, img.Digest, hex[:12]} {
		_, err := a.Get(r)
		notFound("key A gets the operator's unpublished "+r, err)
		_, err = a.Remove(r)
		notFound("key A removes the operator's "+r, err)
		_, err = a.Publish(r, true)
		notFound("key A publishes the operator's "+r, err)
	}
	if l, err := a.List(); err != nil || len(l) != 0 {
		t.Errorf("key A's list: %+v %v, want empty", l, err)
	}

	// Key A's own pull of the same name: a second entry, blobs shared.
	mine, err := a.Pull(ctx, ref, imagestore.PullOptions{})
	if err != nil || mine.Owner != "key_a" || mine.Digest != img.Digest {
		t.Fatalf("key A's pull: %+v %v", mine, err)
	}
	if ix := readIndex(t, dir); len(ix) != 2 {
		t.Fatalf("index after key A's pull: %+v, want two entries", ix)
	}
	for _, r := range []string{ref, img.Digest} {
		_, err := b.Get(r)
		notFound("key B gets "+r+" (the operator's and A's, both private)", err)
	}
	if _, err := a.Remove(ref); err != nil {
		t.Fatal(err)
	}
	got, err := op.Get(ref)
	if err != nil || got.Owner != "" {
		t.Fatalf("the operator's image after key A removed its own: %+v %v", got, err)
	}
	if _, err := os.Stat(got.Layers[0].Dir); err != nil {
		t.Errorf("the shared layer went with key A's entry: %v", err)
	}

	// Published: readable by every key, removable by none of them.
	if p, err := op.Publish(ref, true); err != nil || !p.Public {
		t.Fatalf("publish: %+v %v", p, err)
	}
	for _, r := range []string{ref, img.Digest, hex[:12]} {
		if g, err := b.Get(r); err != nil || !g.Public || g.Digest != img.Digest {
			t.Errorf("key B gets the published %s: %+v %v", r, g, err)
		}
	}
	_, err = b.Remove(ref)
	notFound("key B removes the public image", err)
	_, err = b.Publish(ref, false)
	notFound("key B unpublishes the public image", err)

	// Key B's own name over the public one: B's for B only.
	other, err := b.AppendTar(ctx, got, layerFile(t), ref, "test")
	if err != nil || other.Owner != "key_b" || other.Public {
		t.Fatalf("key B's image under the public name: %+v %v", other, err)
	}
	if g, err := b.Get(ref); err != nil || g.Digest != other.Digest {
		t.Errorf("key B gets %s: %+v %v, want its own", ref, g, err)
	}
	if g, err := c.Get(ref); err != nil || g.Digest != img.Digest || !g.Public {
		t.Errorf("key C gets %s: %+v %v, want the operator's public one", ref, g, err)
	}
	_, err = c.Get(other.Digest)
	notFound("key C gets key B's image by digest", err)

	// The operator replaces its own entry only, private again.
	if _, err := op.Pull(ctx, ref, imagestore.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Get(ref)
	notFound("key C after the operator replaced its published name", err)
	if g, err := b.Get(ref); err != nil || g.Digest != other.Digest {
		t.Errorf("key B's own %s after the operator's pull: %+v %v", ref, g, err)
	}
	if l, err := op.List(); err != nil || len(l) != 2 {
		t.Errorf("the operator's list: %+v %v, want both owners' entries", l, err)
	}
}

// readIndex returns the store's index.json entries.
func readIndex(t *testing.T, dir string) []struct {
	Digest      string
	Annotations map[string]string
} {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "oci", "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ix struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(raw, &ix); err != nil {
		t.Fatal(err)
	}
	return ix.Manifests
}

// layerFile writes a one-file layer tar and returns its path.
func layerFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layer.tar")
	if err := os.WriteFile(p, it.TarLayer(t, it.Entry{Name: "etc/b", Type: tar.TypeReg, Data: "b"}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
