package imagestore_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/imagestore"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
)

func openStore(t *testing.T, lim imagestore.Limits) (*imagestore.Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "images")
	s, err := imagestore.Open(dir, lim)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

func countDir(t *testing.T, p string) int {
	t.Helper()
	ents, err := os.ReadDir(p)
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestPullInspectShareRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (image files keep their owners)")
	}
	reg := it.Registry(t)
	base := it.TarLayer(t,
		it.Entry{Name: "etc/", Type: tar.TypeDir, Mode: 0o755},
		it.Entry{Name: "etc/image-marker", Type: tar.TypeReg, Data: "from the image\n"},
		it.Entry{Name: "usr/bin/suid", Type: tar.TypeReg, Mode: 0o4755 | 0o2000, Data: "#!/bin/sh\n"},
		it.Entry{Name: "usr/bin/owned", Type: tar.TypeReg, Mode: 0o644, Data: "x", UID: 1000},
		it.Entry{Name: "usr/bin/bigid", Type: tar.TypeReg, Mode: 0o644, Data: "x", UID: 1 << 20},
		it.Entry{Name: "usr/bin/hl", Type: tar.TypeLink, Link: "usr/bin/owned"},
		it.Entry{Name: "usr/bin/sl", Type: tar.TypeSymlink, Link: "/etc/image-marker"},
		it.Entry{Name: "old/", Type: tar.TypeDir, Mode: 0o755},
		it.Entry{Name: "old/gone", Type: tar.TypeReg, Data: "x"},
		it.Entry{Name: "opaque/", Type: tar.TypeDir, Mode: 0o755},
		it.Entry{Name: "opaque/below", Type: tar.TypeReg, Data: "x"},
	)
	top := it.TarLayer(t,
		it.Entry{Name: "old/.wh.gone", Type: tar.TypeReg},
		it.Entry{Name: "opaque/.wh..wh..opq", Type: tar.TypeReg},
		it.Entry{Name: "opaque/new", Type: tar.TypeReg, Data: "y"},
	)
	other := it.TarLayer(t, it.Entry{Name: "other", Type: tar.TypeReg, Data: "z"})
	ref1 := it.Push(t, reg, "test/one:v1", it.Image(t, base, top))
	ref2 := it.Push(t, reg, "test/two:v1", it.Image(t, base, other))

	s, dir := openStore(t, imagestore.Limits{})
	var last imagestore.Progress
	calls := 0
	img, err := s.Pull(context.Background(), ref1, imagestore.PullOptions{Progress: func(p imagestore.Progress) { last = p; calls++ }})
	if err != nil {
		t.Fatal(err)
	}
	if calls == 0 || last.Done != last.Total || last.Total != img.Size {
		t.Fatalf("progress: %d calls, last %+v, image size %d", calls, last, img.Size)
	}
	if img.Name != ref1 || len(img.Layers) != 2 || img.Config.Env[1] != "IMAGE=test" || img.Platform != "linux/amd64" {
		t.Fatalf("image: %+v", img)
	}
	l0, l1 := img.Layers[0].Dir, img.Layers[1].Dir
	if b, err := os.ReadFile(filepath.Join(l0, "etc/image-marker")); err != nil || string(b) != "from the image\n" {
		t.Fatalf("marker: %q %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(l0, "usr/bin/suid"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 || st.Mode&0o777 != 0o755 {
		t.Fatalf("set-id bits kept: mode %o", st.Mode)
	}
	if err := unix.Lstat(filepath.Join(l0, "usr/bin/owned"), &st); err != nil || st.Uid != 1000 || st.Nlink != 2 {
		t.Fatalf("owned: uid %d nlink %d %v", st.Uid, st.Nlink, err)
	}
	if err := unix.Lstat(filepath.Join(l0, "usr/bin/bigid"), &st); err != nil || st.Uid != 65534 {
		t.Fatalf("owner outside 0-65535 not mapped to nobody: uid %d %v", st.Uid, err)
	}
	if target, err := os.Readlink(filepath.Join(l0, "usr/bin/sl")); err != nil || target != "/etc/image-marker" {
		t.Fatalf("symLink: %q %v", target, err)
	}
	// Whiteouts in overlayfs form.
	if err := unix.Lstat(filepath.Join(l1, "old/gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("whiteout: mode %o rdev %d %v", st.Mode, st.Rdev, err)
	}
	if _, err := os.Lstat(filepath.Join(l1, "old/.wh.gone")); !os.IsNotExist(err) {
		t.Fatalf(".wh. file left in the layer: %v", err)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(l1, "opaque"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opaque xattr: %q %v", buf[:n], err)
	}

	// Second image shares the base layer: unpacked once.
	img2, err := s.Pull(context.Background(), ref2, imagestore.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if img2.Layers[0].Dir != l0 {
		t.Fatalf("shared layer unpacked twice: %s vs %s", img2.Layers[0].Dir, l0)
	}
	if n := countDir(t, filepath.Join(dir, "layers")); n != 3 {
		t.Fatalf("%d unpacked layers, want 3", n)
	}
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].Name != ref1 || list[1].Name != ref2 {
		t.Fatalf("list: %+v %v", list, err)
	}
	// Lookups by short name form and digest prefix.
	if got, err := s.Get(strings.TrimPrefix(img.Digest, "sha256:")[:12]); err != nil || got.Digest != img.Digest {
		t.Fatalf("get by digest prefix: %v", err)
	}
	if _, err := s.Get("nosuch:v1"); !errors.Is(err, imagestore.ErrNotFound) {
		t.Fatalf("get missing: %v", err)
	}
	// Layout stays a valid OCI layout that go-containerregistry reads.
	lp, err := layout.FromPath(filepath.Join(dir, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	h, _ := v1.NewHash(img.Digest)
	if _, err := lp.Image(h); err != nil {
		t.Fatalf("layout image: %v", err)
	}

	// A lease keeps layers of a removed image until it is released.
	if err := s.Lease("sb1", img, ""); err != nil {
		t.Fatal(err)
	}
	alive := filepath.Join(t.TempDir(), "sb2")
	os.Mkdir(alive, 0o700)
	if err := s.Lease("sb2", img2, alive); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ref1); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l1); err != nil {
		t.Fatalf("leased layer removed: %v", err)
	}
	if err := s.Release("sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ref2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img2.Layers[1].Dir); err != nil {
		t.Fatalf("layer leased by a live sandbox removed: %v", err)
	}
	// Once the sandbox's directory is gone its lease lapses: the next
	// removal collects the layers.
	os.Remove(alive)
	img3, err := s.Pull(context.Background(), ref1, imagestore.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img2.Layers[1].Dir); !os.IsNotExist(err) {
		t.Fatalf("layer of a lapsed lease kept: %v", err)
	}
	if _, err := s.Remove(img3.Name); err != nil {
		t.Fatal(err)
	}
	if n := countDir(t, filepath.Join(dir, "layers")); n != 0 {
		t.Fatalf("%d unpacked layers left after removing every image", n)
	}
	if n := countDir(t, filepath.Join(dir, "oci", "blobs", "sha256")); n != 0 {
		t.Fatalf("%d blobs left after removing every image", n)
	}
}

func TestImportArchives(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	img := it.Image(t, it.TarLayer(t, it.Entry{Name: "etc/image-marker", Type: tar.TypeReg, Data: "m"}))
	tmp := t.TempDir()
	// docker save format
	tag, _ := name.NewTag("example.com/saved:1")
	dockerTar := filepath.Join(tmp, "docker.tar")
	if err := tarball.WriteToFile(dockerTar, tag, img); err != nil {
		t.Fatal(err)
	}
	// OCI layout as a tar
	lp, err := layout.Write(filepath.Join(tmp, "oci"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{imagestore.RefAnnotation: "example.com/oci:2"})); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(tmp, "oci.tar")
	tarDir(t, filepath.Join(tmp, "oci"), ociTar)

	s, _ := openStore(t, imagestore.Limits{})
	got, err := s.Import(context.Background(), dockerTar, "", nil)
	if err != nil || len(got) != 1 || got[0].Name != "example.com/saved:1" {
		t.Fatalf("docker import: %+v %v", got, err)
	}
	got, err = s.Import(context.Background(), ociTar, "", nil)
	if err != nil || len(got) != 1 || got[0].Name != "example.com/oci:2" {
		t.Fatalf("oci import: %+v %v", got, err)
	}
	got, err = s.Import(context.Background(), ociTar, "renamed:3", nil)
	if err != nil || len(got) != 1 || got[0].Name != "index.docker.io/library/renamed:3" {
		t.Fatalf("oci import as: %+v %v", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(got[0].Layers[0].Dir, "etc/image-marker")); err != nil || string(b) != "m" {
		t.Fatalf("imported layer: %q %v", b, err)
	}
	if _, err := s.Get("renamed:3"); err != nil {
		t.Fatalf("get by short Name: %v", err)
	}
	notTar := filepath.Join(tmp, "x")
	os.WriteFile(notTar, []byte("hello"), 0o644)
	if _, err := s.Import(context.Background(), notTar, "", nil); err == nil || !strings.Contains(err.Error(), "not a tar") && !strings.Contains(err.Error(), "neither") {
		t.Fatalf("import of a non-archive: %v", err)
	}
}

// tarDir writes the regular files under dir to a tar at out.
func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// snapshot lists every path under dir with its mode and size.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			b.WriteString(p + " " + fi.Mode().String() + "\n")
		}
		return nil
	})
	return b.String()
}

func TestHostileLayers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	reg := it.Registry(t)
	outside := t.TempDir() // what a layer must never reach
	os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600)
	before := snapshot(t, outside)
	up := strings.Repeat("../", 20)

	many := []it.Entry{}
	for i := 0; i < 1500; i++ {
		many = append(many, it.Entry{Name: "f/" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "/" + time.Duration(i).String(), Type: tar.TypeReg})
	}
	zeros := strings.Repeat("\x00", 32<<20)

	cases := []struct {
		Name    string
		ents    []it.Entry
		wantErr string // "" means neutralised: the pull succeeds
		check   func(t *testing.T, root string)
	}{
		{Name: "dotdot", ents: []it.Entry{{Name: up + strings.TrimPrefix(outside, "/") + "/pwned", Type: tar.TypeReg, Data: "x"}}, wantErr: "'..' would leave the layer"},
		{Name: "dotdot-middle", ents: []it.Entry{{Name: "a/../../pwned", Type: tar.TypeReg, Data: "x"}}, wantErr: "'..'"},
		{Name: "absolute", ents: []it.Entry{{Name: outside + "/pwned", Type: tar.TypeReg, Data: "x"}},
			check: func(t *testing.T, root string) {
				if _, err := os.Stat(filepath.Join(root, outside, "pwned")); err != nil {
					t.Fatalf("absolute name not kept inside the layer: %v", err)
				}
			}},
		{Name: "symlink-parent-abs", ents: []it.Entry{{Name: "evil", Type: tar.TypeSymlink, Link: outside}, {Name: "evil/pwned", Type: tar.TypeReg, Data: "x"}}, wantErr: "symlink"},
		{Name: "symlink-parent-rel", ents: []it.Entry{{Name: "a/", Type: tar.TypeDir, Mode: 0o755}, {Name: "a/evil", Type: tar.TypeSymlink, Link: up}, {Name: "a/evil/" + strings.TrimPrefix(outside, "/") + "/pwned", Type: tar.TypeReg, Data: "x"}}, wantErr: "symlink"},
		{Name: "dir-then-symlink", ents: []it.Entry{{Name: "a/", Type: tar.TypeDir, Mode: 0o755}, {Name: "a/.wh..wh..opq", Type: tar.TypeReg}, {Name: "a", Type: tar.TypeSymlink, Link: outside}, {Name: "a/pwned", Type: tar.TypeReg, Data: "x"}}, wantErr: "symlink"},
		{Name: "symlink-then-dir", ents: []it.Entry{{Name: "evil", Type: tar.TypeSymlink, Link: outside}, {Name: "evil/sub/", Type: tar.TypeDir, Mode: 0o755}}, wantErr: "symlink"},
		{Name: "file-over-symlink", ents: []it.Entry{{Name: "evil", Type: tar.TypeSymlink, Link: outside + "/secret"}, {Name: "evil", Type: tar.TypeReg, Data: "overwritten"}},
			check: func(t *testing.T, root string) {
				if b, _ := os.ReadFile(filepath.Join(root, "evil")); string(b) != "overwritten" {
					t.Fatalf("file replacing a symLink: %q", b)
				}
			}},
		{Name: "hardlink-dotdot", ents: []it.Entry{{Name: "hl", Type: tar.TypeLink, Link: up + strings.TrimPrefix(outside, "/") + "/secret"}}, wantErr: "'..'"},
		{Name: "hardlink-absolute", ents: []it.Entry{{Name: "hl", Type: tar.TypeLink, Link: outside + "/secret"}}, wantErr: "not in the layer"},
		{Name: "hardlink-through-symlink", ents: []it.Entry{{Name: "evil", Type: tar.TypeSymlink, Link: outside}, {Name: "hl", Type: tar.TypeLink, Link: "evil/secret"}}, wantErr: "symlink"},
		{Name: "hardlink-to-dir", ents: []it.Entry{{Name: "d/", Type: tar.TypeDir, Mode: 0o755}, {Name: "hl", Type: tar.TypeLink, Link: "d"}}, wantErr: "not a regular file"},
		{Name: "char-device", ents: []it.Entry{{Name: "dev/mem", Type: tar.TypeChar, Major: 1, Mode: 0o666}}, wantErr: "device nodes are not allowed"},
		{Name: "block-device", ents: []it.Entry{{Name: "sda", Type: tar.TypeBlock, Major: 8, Mode: 0o666}}, wantErr: "device nodes are not allowed"},
		{Name: "whiteout-dotdot", ents: []it.Entry{{Name: "a/.wh..", Type: tar.TypeReg}}, wantErr: "no name to hide"},
		{Name: "whiteout-through-symlink", ents: []it.Entry{{Name: "evil", Type: tar.TypeSymlink, Link: outside}, {Name: "evil/.wh.secret", Type: tar.TypeReg}}, wantErr: "symlink"},
		{Name: "opaque-through-symlink", ents: []it.Entry{{Name: "evil", Type: tar.TypeSymlink, Link: outside}, {Name: "evil/.wh..wh..opq", Type: tar.TypeReg}}, wantErr: "symlink"},
		{Name: "sparse-10gb", ents: []it.Entry{{Name: "sparse", Type: tar.TypeReg, Size: 10 << 30}}, wantErr: "cap of 8388608 bytes"},
		{Name: "decompression-bomb", ents: []it.Entry{{Name: "zeros", Type: tar.TypeReg, Data: zeros}}, wantErr: "cap of 8388608 bytes"},
		{Name: "inode-bomb", ents: many, wantErr: "cap of 1000 files"},
	}
	s, dir := openStore(t, imagestore.Limits{MaxBytes: 8 << 20, MaxFiles: 1000})
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			ref := it.Push(t, reg, "hostile/"+c.Name+":v1", it.Image(t, it.TarLayer(t, c.ents...)))
			img, err := s.Pull(context.Background(), ref, imagestore.PullOptions{})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("pull: %v, want an error containing %q", err, c.wantErr)
				}
				if !errors.Is(err, imagestore.ErrInvalidImage) {
					t.Fatalf("refusal is not ErrInvalidImage: %v", err)
				}
				if _, gerr := s.Get(ref); !errors.Is(gerr, imagestore.ErrNotFound) {
					t.Fatalf("refused image is listed: %v", gerr)
				}
			} else {
				if err != nil {
					t.Fatalf("pull: %v", err)
				}
				c.check(t, img.Layers[0].Dir)
			}
			if after := snapshot(t, outside); after != before {
				t.Fatalf("a layer wrote outside the store:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			if n := countDir(t, filepath.Join(dir, "tmp")); n != 0 {
				t.Fatalf("%d leftovers in the store's tmp", n)
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "host secret" {
		t.Fatalf("outside file changed: %q", b)
	}
}

// TestCommitUpper: a sandbox's upper directory becomes a new image: files
// with their owners shifted back from the sandbox's host range, overlayfs
// whiteouts as OCI whiteouts, symlinks as symlinks (never followed, even to
// a host secret).
func TestCommitUpper(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	reg := it.Registry(t)
	ref := it.Push(t, reg, "commit/base:1", it.Image(t, it.TarLayer(t,
		it.Entry{Name: "etc/keep", Type: tar.TypeReg, Data: "k"},
		it.Entry{Name: "etc/drop", Type: tar.TypeReg, Data: "d"})))
	s, _ := openStore(t, imagestore.Limits{})
	base, err := s.Pull(context.Background(), ref, imagestore.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const idBase = 1 << 20
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("host secret"), 0o600)
	upper := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(upper, "usr/local/lib"), 0o755))
	must(os.WriteFile(filepath.Join(upper, "usr/local/lib/pkg.py"), []byte("print(1)\n"), 0o644))
	must(os.Lchown(filepath.Join(upper, "usr/local/lib/pkg.py"), idBase+1000, idBase+1000))
	must(os.Symlink(secret, filepath.Join(upper, "usr/local/leak")))
	must(os.MkdirAll(filepath.Join(upper, "etc"), 0o755))
	must(unix.Mknod(filepath.Join(upper, "etc/drop"), unix.S_IFCHR, 0))
	must(os.MkdirAll(filepath.Join(upper, "opq"), 0o755))
	must(unix.Setxattr(filepath.Join(upper, "opq"), "trusted.overlay.opaque", []byte("y"), 0))

	img, err := s.Commit(context.Background(), base, upper, idBase, "snap/one:1")
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "index.docker.io/snap/one:1" || len(img.Layers) != 2 || img.Layers[0].DiffID != base.Layers[0].DiffID {
		t.Fatalf("snapshot image: %+v", img)
	}
	top := img.Layers[1].Dir
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(top, "usr/local/lib/pkg.py"), &st); err != nil || st.Uid != 1000 {
		t.Fatalf("file owner not shifted back: uid %d %v", st.Uid, err)
	}
	if l, err := os.Readlink(filepath.Join(top, "usr/local/leak")); err != nil || l != secret {
		t.Fatalf("symlink: %q %v", l, err)
	}
	if err := unix.Lstat(filepath.Join(top, "etc/drop"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("whiteout lost: mode %o %v", st.Mode, err)
	}
	buf := make([]byte, 4)
	if n, err := unix.Lgetxattr(filepath.Join(top, "opq"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opaque dir lost: %v", err)
	}
	// Nothing of the host secret is in any blob of the store.
	blobs, _ := filepath.Glob(filepath.Join(s.Dir(), "oci", "blobs", "sha256", "*"))
	for _, b := range blobs {
		data, _ := os.ReadFile(b)
		if bytes.Contains(data, []byte("host secret")) {
			t.Fatalf("host secret in blob %s", b)
		}
	}
}

// TestStreamedUnpackWaitsForDigest: a layer is unpacked while it
// downloads, but a blob whose digest fails (here a registry that changes
// the OS byte of the gzip header, which no checksum covers, so the size,
// the unpacked content and its diff id are still right) leaves no unpacked
// layer behind and fails the pull.
func TestStreamedUnpackWaitsForDigest(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	reg := it.Registry(t)
	img := it.Image(t, it.TarLayer(t, it.Entry{Name: "etc/marker", Type: tar.TypeReg, Data: "x"}))
	ref := it.Push(t, reg, "tamper/img:v1", img)
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	ld, _ := ls[0].Digest()
	target, _ := url.Parse("http://" + reg)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodGet || !strings.HasSuffix(resp.Request.URL.Path, "/blobs/"+ld.String()) {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if len(body) < 10 || body[0] != 0x1f || body[1] != 0x8b {
			return fmt.Errorf("layer blob is not gzip")
		}
		body[9] ^= 0xff // gzip header OS byte
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	srv := httptest.NewServer(proxy)
	defer srv.Close()
	s, dir := openStore(t, imagestore.Limits{})
	tampered := strings.Replace(ref, reg, strings.TrimPrefix(srv.URL, "http://"), 1)
	if _, err := s.Pull(context.Background(), tampered, imagestore.PullOptions{}); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("pull of a blob with a wrong digest: %v, want a sha256 mismatch", err)
	}
	if n := countDir(t, filepath.Join(dir, "layers")); n != 0 {
		t.Fatalf("%d layers unpacked from a blob whose digest failed", n)
	}
	if n := countDir(t, filepath.Join(dir, "tmp")); n != 0 {
		t.Fatalf("%d leftovers in the store's tmp", n)
	}
	if _, err := s.Pull(context.Background(), ref, imagestore.PullOptions{}); err != nil {
		t.Fatalf("pull of the untampered image: %v", err)
	}
	if n := countDir(t, filepath.Join(dir, "layers")); n != 1 {
		t.Fatalf("%d layers after the good pull, want 1", n)
	}
}
