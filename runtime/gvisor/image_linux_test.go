package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/imagestore"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/runtime/native"
)

func busybox(t testing.TB) (*imagestore.Store, *imagestore.Image) {
	t.Helper()
	needRunsc(t)
	ref := it.Push(t, it.Registry(t), "gvisor/busybox:1", it.Busybox(t))
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

// TestImageRootGVisor: a gVisor sandbox whose root is an image runs the
// image's busybox (not the host's /usr), sees the image's owners as they
// are, writes anywhere in its root as the image's root, and its writes
// land in the per-sandbox upper directory on the host with the sandbox's
// own ids (what a snapshot commits with id base 0); the image store is
// unchanged, and nothing stays mounted once it ends.
func TestImageRootGVisor(t *testing.T) {
	st, img := busybox(t)
	before := it.TreeSig(t, st.Dir())
	root := filepath.Join(t.TempDir(), "sb-root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	defer native.RemoveImageRoot(root)
	ir := &native.ImageRoot{Layers: img.LayerDirs(), Dir: root}
	p := gvPolicy(t, func(p *policy.Policy) {
		p.User.UID, p.User.GID, p.User.Name = 0, 0, "root"
		p.Env = []string{"PATH=/bin"}
		p.Limits.DiskBytes = 8 << 20
	})
	res, err := gvisor.Run(context.Background(), native.Config{Policy: p, Image: ir,
		Args: []string{"/bin/sh", "-c", "uname -r; ls /usr/bin/python3 2>&1; echo hi > /etc/written; mkdir -p /usr/local/x && echo ok"}},
		native.RunOptions{Capture: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != native.StatusOK || !strings.HasSuffix(res.Stdout, "ok\n") || strings.Contains(res.Stdout, "\n/usr/bin/python3\n") {
		t.Fatalf("image root under gVisor: %+v", res)
	}
	if _, ok := res.Enforced.Get("rootfs"); !ok {
		t.Fatalf("no rootfs layer reported: %+v", res.Enforced)
	}
	upper := ir.UpperDir()
	if b, err := os.ReadFile(filepath.Join(upper, "etc", "written")); err != nil || string(b) != "hi\n" {
		t.Fatalf("write did not land in the upper directory: %q %v", b, err)
	}
	fi, err := os.Lstat(filepath.Join(upper, "usr", "local", "x"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Gid != 0 {
		t.Fatalf("a directory made by uid 0 inside is host %d:%d in the upper directory, want the sandbox's own ids (0:0)", st.Uid, st.Gid)
	}
	if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), filepath.Join(root, "merged")) {
		t.Fatal("the overlay is still mounted after the sandbox ended")
	}
	if after := it.TreeSig(t, st.Dir()); after != before {
		t.Fatal("the image store changed")
	}
}
