package native_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/idrange"
)

// TestVolumeAcrossRanges: a volume written by a sandbox of one host id
// range is read and appended to by a sandbox of another with the same
// owners (ID-mapped mounts), is stored on disk with the sandbox's own ids,
// and stops at its size.
func TestVolumeAcrossRanges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("volumes need root")
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "vol.img"), filepath.Join(dir, "mnt")
	if err := native.MakeDisk(img, 8<<20, 1024, 0, true); err != nil {
		t.Fatal(err)
	}
	if err := native.MountDisk(img, mnt); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	pool, err := idrange.Default()
	if err != nil {
		t.Fatal(err)
	}
	var bases []int
	for range 2 {
		l, err := pool.Acquire(os.Getpid(), 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		bases = append(bases, l.Base)
	}
	run := func(base int, script string) *native.Result {
		t.Helper()
		p := strict(t)
		res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/sh", "-c", script}, HostIDBase: base,
			Volumes: []native.VolumeMount{{Dir: mnt, Target: "/data"}}}, native.RunOptions{Capture: true})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := run(bases[0], "echo from-a > /data/a && stat -c %u /data/a")
	if res.Status != native.StatusOK || res.Stdout != "1000\n" {
		t.Fatalf("sandbox a: %+v", res)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(mnt, "a"), &st); err != nil || st.Uid != 1000 {
		t.Fatalf("on disk the file belongs to uid %d (want the sandbox's own 1000): %v", st.Uid, err)
	}
	res = run(bases[1], "echo from-b >> /data/a && cat /data/a && stat -c %u /data/a; dd if=/dev/zero of=/data/big bs=1M count=20 2>&1 | grep -o 'No space left on device'")
	if res.Status != native.StatusOK || res.Stdout != "from-a\nfrom-b\n1000\nNo space left on device\n" {
		t.Fatalf("sandbox b (range %d, a had %d): %+v", bases[1], bases[0], res)
	}
}
