package native_test

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/runtime/native"
)

// BenchmarkColdStartImageTrue is BenchmarkColdStartTrue with the root
// from an image (busybox, the strict profile's 256 MiB disk cap): the
// overlay, its ID-mapped layers and the capped upper disk are made on
// every run (the removal afterwards is not timed). Compare the two for
// the cost of an image root.
func BenchmarkColdStartImageTrue(b *testing.B) { benchImageStart(b, nil, true) }

// BenchmarkColdStartPlainTrue is the same loop with the default
// (host-derived) root, running busybox from the host: the baseline of the
// image benchmarks, with the same min and median metrics.
func BenchmarkColdStartPlainTrue(b *testing.B) { benchImageStart(b, nil, false) }

// BenchmarkColdStartImageTruePooled is BenchmarkColdStartImageTrue with a
// DiskPool of ready upper disks, refilled between runs (untimed), as a
// server's pool is between creates.
func BenchmarkColdStartImageTruePooled(b *testing.B) {
	pool, err := native.OpenDiskPool(filepath.Join(b.TempDir(), "pool"), 1)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	benchImageStart(b, pool, true)
}

// benchImageStart times runs of busybox true, from the image or not. Besides
// the mean it reports the minimum and the median per run (min-ns/op,
// p50-ns/op; on a shared machine the mean mostly measures the neighbours)
// and of the time until the program runs (start-min-ns/op, start-p50-ns/op).
func benchImageStart(b *testing.B, pool *native.DiskPool, image bool) {
	_, img := busyboxImage(b)
	p := strict(b)
	p.Env = []string{"PATH=/bin"}
	dir := b.TempDir()
	imageRoot := func(root string) *native.ImageRoot {
		if !image {
			return nil
		}
		return &native.ImageRoot{Layers: img.LayerDirs(), Dir: root, Disks: pool}
	}
	var times, starts []time.Duration
	defer func() {
		if len(times) == 0 {
			return
		}
		slices.Sort(times)
		slices.Sort(starts)
		b.ReportMetric(float64(times[0].Nanoseconds()), "min-ns/op")
		b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns/op")
		// Until the program runs (Start returned): what an API create
		// waits for; the rest of a run is the program and Wait.
		b.ReportMetric(float64(starts[0].Nanoseconds()), "start-min-ns/op")
		b.ReportMetric(float64(starts[len(starts)/2].Nanoseconds()), "start-p50-ns/op")
	}()
	run := func(root string) {
		res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/busybox", "true"},
			Image: imageRoot(root)}, native.RunOptions{})
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
		t0 := time.Now()
		res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/busybox", "true"},
			Image: imageRoot(root)}, native.RunOptions{OnStart: func(*native.Sandbox) { starts = append(starts, time.Since(t0)) }})
		times = append(times, time.Since(t0))
		b.StopTimer()
		var rerr error
		if image {
			rerr = native.RemoveImageRoot(root)
		}
		if err != nil || res.Status != native.StatusOK {
			b.Fatalf("%v %+v", err, res)
		}
		if rerr != nil {
			b.Fatal(rerr)
		}
		b.StartTimer()
	}
}
