package native_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/runtime/native"
)

// TestDiskPool: an image sandbox takes a ready upper disk from a DiskPool
// (the very filesystem the pool made, seen by its mount's device from the
// host), writes
// to it, and the next sandbox gets a different, empty disk; removing the
// roots and closing the pool leaves no mount behind.
func TestDiskPool(t *testing.T) {
	_, img := busyboxImage(t)
	p := strict(t)
	p.Env = []string{"PATH=/bin"}
	poolDir := filepath.Join(t.TempDir(), "pool")
	pool, err := native.OpenDiskPool(poolDir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	dir := t.TempDir()
	start := func(name, script string) (string, string) {
		t.Helper()
		root := filepath.Join(dir, name)
		t.Cleanup(func() { native.RemoveImageRoot(root) })
		r, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/sh", "-c", script},
			Image: &native.ImageRoot{Layers: img.LayerDirs(), Dir: root, Disks: pool}}, native.RunOptions{Capture: true})
		if err != nil || r.Status != native.StatusOK {
			t.Fatalf("%s: %v %+v", name, err, r)
		}
		return root, r.Stdout
	}
	dev := func(path string) uint64 {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Dev
	}
	waitReady := func() map[uint64]bool {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for pool.Ready(p.Limits.DiskBytes, p.Limits.Inodes) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the pool made no disk within a minute")
			}
			time.Sleep(10 * time.Millisecond)
		}
		devs := map[uint64]bool{}
		ents, _ := os.ReadDir(poolDir)
		for _, e := range ents {
			devs[dev(filepath.Join(poolDir, e.Name(), "disk"))] = true
		}
		if len(devs) == 0 {
			t.Fatal("pool reports a ready disk but holds none")
		}
		return devs
	}
	// The first start finds the pool empty, makes its own disk and starts
	// the filling.
	r0, _ := start("r0", "true")
	pooled := waitReady()
	r1, out := start("r1", "echo secret > /workspace/left; cat /workspace/left")
	if !pooled[dev(filepath.Join(r1, "disk"))] || out != "secret\n" {
		t.Fatalf("r1: disk device %d, pool's %v; output %q", dev(filepath.Join(r1, "disk")), pooled, out)
	}
	if b, err := os.ReadFile(filepath.Join((&native.ImageRoot{Dir: r1}).UpperDir(), "workspace/left")); err != nil || string(b) != "secret\n" {
		t.Fatalf("r1's write on its pooled disk, from the host: %q %v", b, err)
	}
	pooled = waitReady()
	r2, out := start("r2", "test ! -e /workspace/left && echo clean")
	if !pooled[dev(filepath.Join(r2, "disk"))] || dev(filepath.Join(r2, "disk")) == dev(filepath.Join(r1, "disk")) || out != "clean\n" {
		t.Fatalf("r2: disk device %d (r1's %d), pool's %v; output %q", dev(filepath.Join(r2, "disk")), dev(filepath.Join(r1, "disk")), pooled, out)
	}
	for _, r := range []string{r0, r1, r2} {
		if err := native.RemoveImageRoot(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), dir) || strings.Contains(string(mi), poolDir) {
		t.Fatalf("mounts left behind:\n%s", mi)
	}
}
