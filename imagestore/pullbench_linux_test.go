package imagestore_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/airlock-dev/airlock/imagestore"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
)

// debianRef pushes the mmdebstrap Debian image (imagetest.DebianPython) to
// a local registry and returns its reference and compressed size.
func debianRef(b *testing.B) (string, int64) {
	b.Helper()
	layer, _ := it.DebianLayer(b)
	fi, err := os.Stat(layer)
	if err != nil {
		b.Fatal(err)
	}
	return it.Push(b, it.Registry(b), "bench/debian:12", it.DebianPython(b)), fi.Size()
}

// BenchmarkPullDebian: `airlock image pull` of the Debian image (python3,
// pip, venv; one 75 MB gzipped layer, ~196 MB and ~8,900 files unpacked)
// from go-containerregistry's registry on 127.0.0.1 into a fresh store:
// download, digest checks and the hostile-input-safe unpacking. MB/s is of
// the compressed bytes. Compare BenchmarkCranePullDebian.
func BenchmarkPullDebian(b *testing.B) {
	ref, size := debianRef(b)
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st, err := imagestore.Open(filepath.Join(b.TempDir(), "images"), imagestore.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := st.Pull(context.Background(), ref, imagestore.PullOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(st.Dir())
		b.StartTimer()
	}
}

// BenchmarkCranePullDebian: `crane pull --format=oci` of the same image
// from the same kind of registry (crane from $CRANE or PATH; go install
// github.com/google/go-containerregistry/cmd/crane): download and digest
// checks, no unpacking.
func BenchmarkCranePullDebian(b *testing.B) {
	crane := os.Getenv("CRANE")
	if crane == "" {
		var err error
		if crane, err = exec.LookPath("crane"); err != nil {
			b.Skip("crane not found: set CRANE or put it on PATH")
		}
	}
	ref, size := debianRef(b)
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out := filepath.Join(b.TempDir(), strconv.Itoa(i))
		if o, err := exec.Command(crane, "pull", "--insecure", "--format=oci", ref, out).CombinedOutput(); err != nil {
			b.Fatalf("crane pull: %v\n%s", err, o)
		}
		b.StopTimer()
		os.RemoveAll(out)
		b.StartTimer()
	}
}
