package imagetest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/debimage"
	"github.com/airlock-dev/airlock/imagestore"
)

// DebImage returns a `docker save` archive of one of debimage's images
// (debimage.Desktop(), debimage.Browser()), built here by mmdebstrap once
// and cached in CacheDir() by content. A cold build takes several minutes
// and needs root and mmdebstrap; scripts/setup.sh --tests builds the
// desktop image in the background so that tests find it cached.
func DebImage(t testing.TB, spec *debimage.Spec) string {
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
	archive, err := debimage.Archive(spec, layer)
	if err != nil {
		t.Fatalf("the %s image's archive: %v", spec.Name, err)
	}
	t.Logf("%s image %s (layer cached %v) in %s", spec.Name, archive, cached, time.Since(start).Round(time.Second))
	return archive
}

// StoreDebImage puts debimage's image spec into the image store of the
// state directory state (before a server on it starts) under the name
// spec.Name, published so that every API key can use it, as an operator
// does with `airlock image import --name NAME` and `airlock image publish`.
func StoreDebImage(t testing.TB, state string, spec *debimage.Spec) {
	t.Helper()
	archive := DebImage(t, spec)
	st, err := imagestore.Open(filepath.Join(state, "images"), imagestore.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := st.Import(context.Background(), archive, spec.Name, nil); err != nil {
		t.Fatalf("import %s: %v", archive, err)
	}
	if _, err := st.Publish(spec.Name, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s image imported in %s", spec.Name, time.Since(start).Round(time.Second))
}
