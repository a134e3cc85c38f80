package imagetest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"airlock/debimage"
	"airlock/imagestore"
)

// DebImage returns one of debimage's images (debimage.Desktop(),
// debimage.Browser()), built here by mmdebstrap once and cached in
// CacheDir() by content. A cold build takes several minutes and needs root
// and mmdebstrap; scripts/setup.sh --tests builds the desktop image in the
// background so that tests find it cached.
func DebImage(t testing.TB, spec *debimage.Spec) v1.Image {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mmdebstrap needs root")
	}
	var log strings.Builder
	start := time.Now()
	layer, cached, err := debimage.Build(context.Background(), spec, CacheDir(), &log)
	if err != nil {
		t.Fatalf("building the %s image: %v\n%s", spec.Name, err, log.String())
	}
	t.Logf("%s image layer %s (cached %v) in %s", spec.Name, layer, cached, time.Since(start).Round(time.Second))
	img, err := debimage.Image(spec, layer)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// StoreDebImage puts debimage's image spec into the image store of the
// state directory state (before a server on it starts) under the name
// spec.Name, published so that every API key can use it, as an operator
// would with `airlock image import` and `airlock image publish`.
func StoreDebImage(t testing.TB, state string, spec *debimage.Spec) {
	t.Helper()
	img := DebImage(t, spec)
	ref := Push(t, Registry(t), "debimage/"+spec.Name+":1", img)
	st, err := imagestore.Open(filepath.Join(state, "images"), imagestore.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got, err := st.Pull(ctx, ref, imagestore.PullOptions{})
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	if _, err := st.Tag(ctx, got, spec.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Publish(spec.Name, true); err != nil {
		t.Fatal(err)
	}
}
