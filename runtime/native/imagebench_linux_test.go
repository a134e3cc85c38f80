package native_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"airlock/runtime/native"
)

// BenchmarkColdStartImageTrue is BenchmarkColdStartTrue with the root
// from an image (busybox, the strict profile's 256 MiB disk cap): the
// overlay, its ID-mapped layers and the capped upper disk are made on
// every run (the removal afterwards is not timed). Compare the two for
// the cost of an image root.
func BenchmarkColdStartImageTrue(b *testing.B) { benchImageStart(b, nil) }

// BenchmarkColdStartImageTruePooled is BenchmarkColdStartImageTrue with a
// DiskPool of ready upper disks, refilled between runs (untimed), as a
// server's pool is between creates.
func BenchmarkColdStartImageTruePooled(b *testing.B) {
	pool, err := native.OpenDiskPool(filepath.Join(b.TempDir(), "pool"), 1)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	benchImageStart(b, pool)
}

func benchImageStart(b *testing.B, pool *native.DiskPool) {
	_, img := busyboxImage(b)
	p := strict(b)
	p.Env = []string{"PATH=/bin"}
	dir := b.TempDir()
	run := func(root string) {
		res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/busybox", "true"},
			Image: &native.ImageRoot{Layers: img.LayerDirs(), Dir: root, Disks: pool}}, native.RunOptions{})
		rerr := native.RemoveImageRoot(root)
		if err != nil || res.Status != native.StatusOK {
			b.Fatalf("%v %+v", err, res)
		}
		if rerr != nil {
			b.Fatal(rerr)
		}
	}
	if pool != nil {
		run(filepath.Join(dir, "first")) // starts the filling
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for pool != nil && pool.Ready(p.Limits.DiskBytes, p.Limits.Inodes) == 0 {
			time.Sleep(time.Millisecond)
		}
		b.StartTimer()
		root := filepath.Join(dir, strconv.Itoa(i))
		res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/busybox", "true"},
			Image: &native.ImageRoot{Layers: img.LayerDirs(), Dir: root, Disks: pool}}, native.RunOptions{})
		b.StopTimer()
		rerr := native.RemoveImageRoot(root)
		if err != nil || res.Status != native.StatusOK {
			b.Fatalf("%v %+v", err, res)
		}
		if rerr != nil {
			b.Fatal(rerr)
		}
		b.StartTimer()
	}
}
