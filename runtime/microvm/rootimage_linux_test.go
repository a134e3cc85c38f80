package microvm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"airlock/runtime/native"
)

// testLayers writes two layers in overlayfs form (as imagestore unpacks
// them): a busybox base, and a layer that adds a file, deletes one (a
// whiteout) and replaces a directory (opaque).
func testLayers(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	l1, l2 := filepath.Join(dir, "l1"), filepath.Join(dir, "l2")
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		l1 + "/gone.txt": "deleted by layer 2\n", l1 + "/keep/old.txt": "from layer 1\n", l1 + "/opaque/a.txt": "hidden\n",
		l1 + "/etc/passwd": "root:x:0:0::/root:/bin/sh\n", l2 + "/new.txt": "from layer 2\n", l2 + "/opaque/b.txt": "replaced\n",
	}
	for p, c := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(l1+"/bin", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l1+"/bin/busybox", bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "cat", "ls", "echo", "id", "dd", "mount", "test", "touch", "rm", "grep", "df"} {
		if err := os.Symlink("busybox", l1+"/bin/"+a); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mknod(l2+"/gone.txt", unix.S_IFCHR|0o000, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(l2+"/opaque", "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	return []string{l1, l2}
}

// TestMicroVMImageRoot: an image's layers become the guest's root: one
// cached read-only EROFS disk of the flattened layers (whiteouts and
// opaque directories applied) under a writable overlay on a per-sandbox
// ext4 upper disk capped at the disk limit, with /workspace on it. The
// host neither mounts the upper disk nor gives QEMU its path; a write the
// guest makes never reaches the cached image.
func TestMicroVMImageRoot(t *testing.T) {
	if err := (Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	agentBinary(t) // the cache directory
	layers := testLayers(t)
	rootDir := t.TempDir()
	vm, c := bootGuestWith(t, func(cfg *native.Config) {
		cfg.Image = &native.ImageRoot{Layers: layers, Dir: rootDir}
		cfg.Policy.Limits.DiskBytes = 64 << 20
	})
	out, st := run(t, c, "cat /new.txt /keep/old.txt; ls /opaque; test -e /gone.txt && echo GONE-VISIBLE; id -u; echo w > /workspace/w && cat /workspace/w; echo t > /tmp/t && cat /tmp/t")
	if st.Code != 0 || out != "from layer 2\nfrom layer 1\nb.txt\n1000\nw\nt\n" {
		t.Fatalf("image root: %d %q", st.Code, out)
	}
	// The root is an overlay; the uid-1000 workload cannot write the
	// image's root-owned directories.
	if out, _ := run(t, c, "grep ' / ' /proc/mounts; touch /etc/x 2>&1"); !strings.Contains(out, "overlay / overlay") || !strings.Contains(out, "nosuid") || !strings.Contains(out, "Permission denied") {
		t.Fatalf("root mount: %q", out)
	}
	// The upper disk is capped at the disk limit.
	if out, _ := run(t, c, "dd if=/dev/zero of=/workspace/big bs=1M count=128 2>&1; rm -f /workspace/big"); !strings.Contains(out, "No space left") {
		t.Fatalf("a 128 MiB write to a 64 MiB disk: %q", out)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", vm.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(cmdline), rootDir) {
		t.Fatalf("QEMU was given the upper disk's path: %q", cmdline)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), rootDir) {
		t.Fatalf("the host mounted the guest's disk:\n%s", mounts)
	}
	img, err := RootImage(layers)
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	vm.Destroy()
	// A second sandbox of the image gets the cached image, unchanged, and
	// a fresh upper disk: nothing the first one wrote.
	_, c2 := bootGuestWith(t, func(cfg *native.Config) {
		cfg.Image = &native.ImageRoot{Layers: layers, Dir: t.TempDir()}
	})
	if out, _ := run(t, c2, "cat /workspace/w 2>&1; cat /new.txt"); !strings.Contains(out, "No such file") || !strings.HasSuffix(out, "from layer 2\n") {
		t.Fatalf("second sandbox: %q", out)
	}
	after, err := os.Stat(img)
	if err != nil || !after.ModTime().Equal(before.ModTime()) || after.Size() != before.Size() {
		t.Fatalf("the cached root image changed: %v %v %v", before, after, err)
	}
}

// TestMicroVMImageRootRefusesBadLayers: layer paths that cannot be
// overlayfs lower directories are refused, not mangled.
func TestMicroVMImageRootRefusesBadLayers(t *testing.T) {
	for _, l := range [][]string{nil, {"relative"}, {"/a:b"}, {"/a,upperdir=/etc"}} {
		if _, err := RootImage(l); err == nil {
			t.Errorf("RootImage(%q) succeeded", l)
		}
	}
}
