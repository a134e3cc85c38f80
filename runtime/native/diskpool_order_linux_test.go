package native

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDiskPoolRefillWaitsForCaller: taking a disk starts no refill (mkfs,
// a loop device and a mount beside the create would compete with it for
// the CPUs and the kernel's RCU work); the refill the take hands back
// does, whether the take found a disk or not.
func TestDiskPoolRefillWaitsForCaller(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (loop devices)")
	}
	pool, err := OpenDiskPool(filepath.Join(t.TempDir(), "pool"), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	key := diskKey{minQuotaDisk, 64}
	filling := func() (bool, int) {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return pool.filling[key], len(pool.ready[key])
	}
	waitReady := func() {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			if f, n := filling(); !f && n == 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the pool made no disk within a minute")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	dir := t.TempDir()

	// Empty pool: no disk, and no filling until the caller asks.
	_, ok, refill := pool.take(key, filepath.Join(dir, "a"), 100000)
	if ok {
		t.Fatal("an empty pool handed out a disk")
	}
	if f, n := filling(); f || n != 0 {
		t.Fatalf("after a take from an empty pool: filling %v, ready %d; want no refill before the caller's", f, n)
	}
	refill()
	waitReady()

	// A ready disk: taken, and again nothing fills until refill.
	disk, ok, refill := pool.take(key, filepath.Join(dir, "b"), 100000)
	if !ok {
		t.Fatal("a ready disk was not handed out")
	}
	defer RemoveImageRoot(filepath.Join(dir, "b"))
	if fi, err := os.Stat(filepath.Join(disk, "upper")); err != nil || fi.Sys() == nil {
		t.Fatalf("taken disk: %v", err)
	}
	if f, n := filling(); f || n != 0 {
		t.Fatalf("after taking the ready disk: filling %v, ready %d; want no refill before the caller's", f, n)
	}
	refill()
	waitReady()
}
