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

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/airlock-dev/airlock/imagestore"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
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

// claimedLayer is a layer that claims another layer's digests: what a
// hostile key's manifest and config can say about any blob.
type claimedLayer struct {
	v1.Layer
	digest, diffID v1.Hash // zero: the embedded layer's
}

func (c claimedLayer) Digest() (v1.Hash, error) {
	if c.digest.Hex != "" {
		return c.digest, nil
	}
	return c.Layer.Digest()
}

func (c claimedLayer) DiffID() (v1.Hash, error) {
	if c.diffID.Hex != "" {
		return c.diffID, nil
	}
	return c.Layer.DiffID()
}

// TestOwnerCannotClaimAnothersLayer: blobs and layers are shared between
// owners, but naming another key's private layer by its digests in a
// manifest of one's own (on a registry the key can push to) does not get
// it: the layer must come from the registry and match both digests. A
// manifest naming B's layer blob that the registry does not have is a
// registry error; one pairing a blob of A's with B's diff id is refused as
// invalid. Neither leaves an image of A's.
func TestOwnerCannotClaimAnothersLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (image files keep their owners)")
	}
	reg := it.Registry(t)
	baseRef := it.Push(t, reg, "claim/base:1", it.Image(t, it.TarLayer(t, it.Entry{Name: "etc/base", Type: tar.TypeReg, Data: "base"})))
	op, _ := openStore(t, imagestore.Limits{})
	a, b := op.As("key_a"), op.As("key_b")
	ctx := context.Background()
	base, err := b.Pull(ctx, baseRef, imagestore.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "secret.tar")
	if err := os.WriteFile(secret, it.TarLayer(t, it.Entry{Name: "etc/b-secret", Type: tar.TypeReg, Data: "b's secret"}), 0o600); err != nil {
		t.Fatal(err)
	}
	bImg, err := b.AppendTar(ctx, base, secret, "bsecret:1", "test")
	if err != nil {
		t.Fatal(err)
	}
	top := bImg.Layers[len(bImg.Layers)-1]
	bDigest, _ := v1.NewHash(top.Digest)
	bDiff, _ := v1.NewHash(top.DiffID)
	own := it.Layer(t, it.TarLayer(t, it.Entry{Name: "etc/a", Type: tar.TypeReg, Data: "a"}))

	// A manifest naming B's blob and diff id; the registry lacks the blob.
	fake, err := mutate.AppendLayers(empty.Image, claimedLayer{Layer: own, digest: bDigest, diffID: bDiff})
	if err != nil {
		t.Fatal(err)
	}
	rawCfg, err := fake.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	ref1, err := name.ParseReference(reg + "/claim/blob:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteLayer(ref1.Context(), static.NewLayer(rawCfg, types.OCIConfigJSON)); err != nil {
		t.Fatal(err)
	}
	if err := remote.Put(ref1, fake); err != nil {
		t.Fatal(err)
	}
	if img, err := a.Pull(ctx, ref1.Name(), imagestore.PullOptions{}); !errors.Is(err, imagestore.ErrRegistry) {
		t.Errorf("key A's manifest naming B's blob: %+v %v, want a registry error", img, err)
	}

	// A blob of A's own, paired with B's diff id.
	fake2, err := mutate.AppendLayers(empty.Image, claimedLayer{Layer: own, diffID: bDiff})
	if err != nil {
		t.Fatal(err)
	}
	ref2 := it.Push(t, reg, "claim/diff:1", fake2)
	if img, err := a.Pull(ctx, ref2, imagestore.PullOptions{}); !errors.Is(err, imagestore.ErrInvalidImage) {
		t.Errorf("key A's blob paired with B's diff id: %+v %v, want ErrInvalidImage", img, err)
	}
	if l, err := a.List(); err != nil || len(l) != 0 {
		t.Errorf("key A's images: %+v %v, want none", l, err)
	}
	// B's image is whole.
	if g, err := b.Get("bsecret:1"); err != nil || g.Digest != bImg.Digest {
		t.Errorf("key B's image: %+v %v", g, err)
	}
	if data, err := os.ReadFile(filepath.Join(top.Dir, "etc", "b-secret")); err != nil || string(data) != "b's secret" {
		t.Errorf("key B's layer: %q %v", data, err)
	}
}
