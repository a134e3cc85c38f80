package microvm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
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
	if err := unix.Mknod(l2+"/gone.txt", unix.S_IFCHR, 0); err != nil {
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
	// The same file, not rebuilt (a hit only marks it used: its times
	// move, for pruneCache).
	if err != nil || !os.SameFile(before, after) || after.Size() != before.Size() || after.ModTime().Before(before.ModTime()) {
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

// TestMicroVMRefusesWhatItCannotPlace: a policy mount the guest cannot
// honour (a host directory, or a writable bind) is refused at start with
// its reason, before QEMU runs, instead of being dropped; a network
// without the proxy's listen addresses is refused too.
func TestMicroVMRefusesWhatItCannotPlace(t *testing.T) {
	if err := (Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	bin := agentBinary(t)
	volDir := t.TempDir()
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*native.Config){
		"directory": func(c *native.Config) {
			c.Policy.Filesystem.Mounts = append(c.Policy.Filesystem.Mounts, policy.Mount{Source: t.TempDir(), Target: "/data"})
		},
		"writable file": func(c *native.Config) {
			c.Policy.Filesystem.Mounts = append(c.Policy.Filesystem.Mounts, policy.Mount{Source: file, Target: "/data/f", Writable: true})
		},
		"network without listeners": func(c *native.Config) { c.Policy.Network.Mode = policy.NetAllowlist },
		"command line too long": func(c *native.Config) {
			for i := range 5 {
				c.Volumes = append(c.Volumes, native.VolumeMount{Dir: volDir, Target: fmt.Sprintf("/%s%d", strings.Repeat("v", 400), i)})
			}
		},
	} {
		p := testPolicy(t)
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		stdin := os.NewFile(uintptr(fds[1]), "agent")
		id := "mvt-refuse-" + strings.ReplaceAll(name, " ", "-")
		cfg := native.Config{ID: id, Policy: p, Args: []string{native.AgentPath, "__agent"}, Stdin: stdin, Agent: true, AgentBinary: bin}
		edit(&cfg)
		inst, _, err := Tier{}.Start(cfg)
		stdin.Close()
		unix.Close(fds[0])
		if err == nil {
			inst.Destroy()
			t.Errorf("%s: started", name)
			continue
		}
		if g, gerr := cgroups.Lookup(id); gerr == nil && g != nil {
			for _, d := range g.Dirs() {
				if _, err := os.Stat(d); !os.IsNotExist(err) {
					t.Errorf("%s: cgroup %s left behind", name, d)
				}
			}
		}
		t.Logf("%s: %v", name, err)
	}
	// No volume daemon is left of the refused starts.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); strings.Contains(string(b), volDir) {
			t.Errorf("left running: %s %q", p, b)
		}
	}
}

// TestMicroVMPlacedFilesAndEnv: the policy's environment (values with
// spaces and quotes, which cannot go on a kernel command line) is every
// workload's, and a read-only host file it places (as the egress CA's
// trust store is placed) is a read-only copy in the guest, where
// OpenSSL's default trust store finds it.
func TestMicroVMPlacedFilesAndEnv(t *testing.T) {
	if err := (Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	src := filepath.Join(t.TempDir(), "bundle.pem")
	if err := os.WriteFile(src, []byte("placed bundle\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, c := bootGuestWith(t, func(cfg *native.Config) {
		cfg.Policy.Env = append(cfg.Policy.Env, `AIRLOCK_TEST_VAR=a b "c"`)
		cfg.Policy.Filesystem.Mounts = append(cfg.Policy.Filesystem.Mounts, policy.Mount{Source: src, Target: "/etc/ssl/certs/ca-certificates.crt"})
	})
	out, _ := run(t, c, `echo "$AIRLOCK_TEST_VAR"; cat /etc/ssl/certs/ca-certificates.crt; (echo x >> /etc/ssl/certs/ca-certificates.crt) 2>/dev/null || echo read-only; python3 -c 'import ssl, os; p = ssl.get_default_verify_paths(); print(p.cafile)'`)
	if out != "a b \"c\"\nplaced bundle\nread-only\n/usr/lib/ssl/cert.pem\n" {
		t.Fatalf("guest: %q", out)
	}
}

// TestMicroVMCachePrune: building an image prunes cached images of its
// kind nobody used for cacheMaxIdle, and keeps recent ones.
func TestMicroVMCachePrune(t *testing.T) {
	old := CacheDir
	CacheDir = t.TempDir()
	defer func() { CacheDir = old }()
	stale, fresh := filepath.Join(CacheDir, "rootfs-stale.erofs"), filepath.Join(CacheDir, "rootfs-fresh.erofs")
	for _, f := range []string{stale, fresh} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-cacheMaxIdle - time.Hour)
	if err := os.Chtimes(stale, long, long); err != nil {
		t.Fatal(err)
	}
	if _, err := RootImage(testLayers(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("an image unused for %s was kept (%v)", cacheMaxIdle, err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a recent image was pruned: %v", err)
	}
}
