package native_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	"airlock/runtime/native"
)

// BenchmarkColdStartImageTrue is BenchmarkColdStartTrue with the root
// from an image (busybox, the strict profile's 256 MiB disk cap): the
// overlay, its ID-mapped layers and the capped upper disk are made and
// removed on every run. Compare the two for the cost of an image root.
func BenchmarkColdStartImageTrue(b *testing.B) {
	_, img := busyboxImage(b)
	p := strict(b)
	p.Env = []string{"PATH=/bin"}
	dir := b.TempDir()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		root := filepath.Join(dir, strconv.Itoa(i))
		res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/busybox", "true"},
			Image: &native.ImageRoot{Layers: img.LayerDirs(), Dir: root}}, native.RunOptions{})
		if err != nil || res.Status != native.StatusOK {
			b.Fatalf("%v %+v", err, res)
		}
		if err := native.RemoveImageRoot(root); err != nil {
			b.Fatal(err)
		}
	}
}
