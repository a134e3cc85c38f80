package native_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/imagestore"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/runtime/native"
)

// busyboxImage stores an image whose root is Debian's static busybox, a
// marker file, a world-unwritable /usr/local owned by the image's root, and
// a file the top layer whites out; it returns the store and the image.
func busyboxImage(t testing.TB) (*imagestore.Store, *imagestore.Image) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("image roots need root")
	}
	ref := it.Push(t, it.Registry(t), "native/busybox:1", it.Busybox(t))
	st, err := imagestore.Open(filepath.Join(t.TempDir(), "images"), imagestore.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	img, err := st.Pull(context.Background(), ref, imagestore.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return st, img
}

// TestImageRoot: a sandbox whose root is an image runs the image's
// busybox, sees the image's files (with the image's owners, through
// ID-mapped layers) and not the host's /usr, writes anywhere in its root
// (/usr/local, /etc) as the image's root user, and leaves the image store
// unchanged; its writes land in the per-sandbox upper directory on disk.
func TestImageRoot(t *testing.T) {
	st, img := busyboxImage(t)
	before := it.TreeSig(t, st.Dir())
	layers := img.LayerDirs()
	rootDir := filepath.Join(t.TempDir(), "sb-root")
	p := strict(t)
	p.User.UID, p.User.GID, p.User.Name = 0, 0, "root"
	p.Env = []string{"PATH=/bin"}
	p.Limits.DiskBytes = 8 << 20 // the upper filesystem's cap
	script := `set -e
cat /etc/image-marker
test ! -e /etc/gone && echo whiteout-ok
test ! -e /usr/bin/python3 && echo no-host-usr
echo written > /usr/local/new-file && cat /usr/local/new-file
echo changed >> /etc/image-marker
mkdir -p /opt/tool && echo x > /opt/tool/y
stat -c '%u:%g' /etc/image-marker /home/app
id -u
test -w /workspace && echo workspace-ok
dd if=/dev/zero of=/opt/big bs=1M count=20 2>/tmp/err || true
grep -o 'No space left on device' /tmp/err
test "$(wc -c < /opt/big)" -le 8388608 && echo capped
`
	res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/sh", "-c", script},
		Image: &native.ImageRoot{Layers: layers, Dir: rootDir}}, native.RunOptions{Capture: true})
	if err != nil {
		t.Fatal(err)
	}
	want := "from the image\nwhiteout-ok\nno-host-usr\nwritten\n0:0\n1000:1000\n0\nworkspace-ok\nNo space left on device\ncapped\n"
	if res.Status != native.StatusOK || res.Stdout != want {
		t.Fatalf("status %s exit %d\nstdout %q\nwant   %q\nstderr %q\nerror %s", res.Status, res.ExitCode, res.Stdout, want, res.Stderr, res.Error)
	}
	if l, ok := res.Enforced.Get("rootfs"); !ok || !strings.Contains(l.Detail, "/usr") {
		t.Fatalf("enforced rootfs layer: %+v", res.Enforced)
	}
	// The writes went to the sandbox's own filesystem: a sparse ext4
	// image in its directory, no bigger than the cap, on a loop device
	// that freed itself when the sandbox ended.
	var sst syscall.Stat_t
	if err := syscall.Stat(filepath.Join(rootDir, "disk.img"), &sst); err != nil || sst.Size != 8<<20 || sst.Blocks*512 > 8<<20 {
		t.Fatalf("disk image: size %d, %d bytes allocated, %v", sst.Size, sst.Blocks*512, err)
	}
	// While the root exists its changes are readable on the host.
	if b, err := os.ReadFile(filepath.Join((&native.ImageRoot{Dir: rootDir}).UpperDir(), "usr/local/new-file")); err != nil || string(b) != "written\n" {
		t.Fatalf("upper dir on the host: %q %v", b, err)
	}
	if after := it.TreeSig(t, st.Dir()); after != before {
		t.Fatalf("the image store changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if b, _ := os.ReadFile(filepath.Join(layers[0], "etc/image-marker")); string(b) != "from the image\n" {
		t.Fatalf("layer changed: %q", b)
	}
	// The overlay is not mounted on the host; the upper filesystem is,
	// until RemoveImageRoot, and then nothing is.
	if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), rootDir+"/merged") {
		t.Fatalf("image root still mounted on the host")
	}
	if err := native.RemoveImageRoot(rootDir); err != nil {
		t.Fatal(err)
	}
	if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), rootDir) {
		t.Fatalf("upper filesystem still mounted after RemoveImageRoot")
	}
	// The loop device goes once nothing holds its file system: the kernel
	// detaches an autoclear device when its last user lets go, which on a
	// loaded machine can come well after the unmount (a lazy one, and
	// the sandbox's own mount namespace going away); what must hold is
	// that it goes, so it is polled for, generously.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		attached := loopsBackedBy(rootDir)
		if len(attached) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("loop device still attached two minutes after RemoveImageRoot: %s", strings.Join(attached, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := os.Stat(rootDir); !os.IsNotExist(err) {
		t.Fatalf("image root dir left: %v", err)
	}
}

// loopsBackedBy lists the loop devices whose backing file is under dir
// (deleted or not), as "device -> file".
func loopsBackedBy(dir string) []string {
	var out []string
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range backing {
		if f, _ := os.ReadFile(b); strings.HasPrefix(string(f), dir+"/") {
			out = append(out, b+" -> "+strings.TrimSpace(string(f)))
		}
	}
	return out
}

// TestImageWorkspaceOnDisk: in an image sandbox /workspace is on the
// capped disk, not a tmpfs charged to memory: 80 MB of files fit under a
// 48 MiB memory limit without an OOM (issue 13: uploads plus an allocation
// killed a sandbox and lost every file).
func TestImageWorkspaceOnDisk(t *testing.T) {
	st, img := busyboxImage(t)
	_ = st
	p := strict(t)
	p.User.UID, p.User.GID, p.User.Name = 0, 0, "root"
	p.Env = []string{"PATH=/bin"}
	p.Limits.MemoryBytes, p.Limits.DiskBytes = 48<<20, 128<<20
	rootDir := filepath.Join(t.TempDir(), "sb-root")
	defer native.RemoveImageRoot(rootDir)
	res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/sh", "-c",
		"dd if=/dev/zero of=/workspace/big bs=1M count=80 2>/dev/null && wc -c < /workspace/big"},
		Image: &native.ImageRoot{Layers: img.LayerDirs(), Dir: rootDir}}, native.RunOptions{Capture: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != native.StatusOK || res.Stdout != "83886080\n" {
		t.Fatalf("80 MB in /workspace under a 48 MiB memory limit: %+v", res)
	}
	if l, _ := res.Enforced.Get("rootfs"); !strings.Contains(l.Detail, "/workspace on it") {
		t.Fatalf("rootfs layer: %+v", l)
	}
}
