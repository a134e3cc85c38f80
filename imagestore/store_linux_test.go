package imagestore_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"airlock/imagestore"
)

// entry is one tar entry of a layer built by a test.
type entry struct {
	name, link string
	typ        byte
	mode       int64
	data       string
	size       int64 // header size when data is not written (a lying header)
	uid        int
	major      int64
}

// tarLayer builds an uncompressed layer tar from entries, exactly as given
// (no cleaning: hostile names stay hostile).
func tarLayer(t *testing.T, ents ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.uid,
			Devmajor: e.major, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if e.size > 0 {
			// A header whose data never follows: only the header is
			// written, as a bomb's would be streamed.
			h.Size = e.size
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			tw.Flush()
			return buf.Bytes()
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			io.WriteString(tw, e.data)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layerOf(t *testing.T, raw []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func imageOf(t *testing.T, layers ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, raw := range layers {
		var err error
		if img, err = mutate.AppendLayers(img, layerOf(t, raw)); err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "IMAGE=test"}
	cf.Config.Cmd = []string{"/bin/sh"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// testRegistry is go-containerregistry's registry on 127.0.0.1.
func testRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t *testing.T, reg, repo string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(reg + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return ref.Name()
}

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
	reg := testRegistry(t)
	base := tarLayer(t,
		entry{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "etc/image-marker", typ: tar.TypeReg, data: "from the image\n"},
		entry{name: "usr/bin/suid", typ: tar.TypeReg, mode: 0o4755 | 0o2000, data: "#!/bin/sh\n"},
		entry{name: "usr/bin/owned", typ: tar.TypeReg, mode: 0o644, data: "x", uid: 1000},
		entry{name: "usr/bin/bigid", typ: tar.TypeReg, mode: 0o644, data: "x", uid: 1 << 20},
		entry{name: "usr/bin/hl", typ: tar.TypeLink, link: "usr/bin/owned"},
		entry{name: "usr/bin/sl", typ: tar.TypeSymlink, link: "/etc/image-marker"},
		entry{name: "old/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "old/gone", typ: tar.TypeReg, data: "x"},
		entry{name: "opaque/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "opaque/below", typ: tar.TypeReg, data: "x"},
	)
	top := tarLayer(t,
		entry{name: "old/.wh.gone", typ: tar.TypeReg},
		entry{name: "opaque/.wh..wh..opq", typ: tar.TypeReg},
		entry{name: "opaque/new", typ: tar.TypeReg, data: "y"},
	)
	other := tarLayer(t, entry{name: "other", typ: tar.TypeReg, data: "z"})
	ref1 := push(t, reg, "test/one:v1", imageOf(t, base, top))
	ref2 := push(t, reg, "test/two:v1", imageOf(t, base, other))

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
		t.Fatalf("symlink: %q %v", target, err)
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
	if err := s.Lease("sb1", img); err != nil {
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
	img := imageOf(t, tarLayer(t, entry{name: "etc/image-marker", typ: tar.TypeReg, data: "m"}))
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
		t.Fatalf("get by short name: %v", err)
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
	reg := testRegistry(t)
	outside := t.TempDir() // what a layer must never reach
	os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600)
	before := snapshot(t, outside)
	up := strings.Repeat("../", 20)

	many := []entry{}
	for i := 0; i < 1500; i++ {
		many = append(many, entry{name: "f/" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "/" + time.Duration(i).String(), typ: tar.TypeReg})
	}
	zeros := strings.Repeat("\x00", 32<<20)

	cases := []struct {
		name    string
		ents    []entry
		wantErr string // "" means neutralised: the pull succeeds
		check   func(t *testing.T, root string)
	}{
		{name: "dotdot", ents: []entry{{name: up + strings.TrimPrefix(outside, "/") + "/pwned", typ: tar.TypeReg, data: "x"}}, wantErr: "'..' would leave the layer"},
		{name: "dotdot-middle", ents: []entry{{name: "a/../../pwned", typ: tar.TypeReg, data: "x"}}, wantErr: "'..'"},
		{name: "absolute", ents: []entry{{name: outside + "/pwned", typ: tar.TypeReg, data: "x"}},
			check: func(t *testing.T, root string) {
				if _, err := os.Stat(filepath.Join(root, outside, "pwned")); err != nil {
					t.Fatalf("absolute name not kept inside the layer: %v", err)
				}
			}},
		{name: "symlink-parent-abs", ents: []entry{{name: "evil", typ: tar.TypeSymlink, link: outside}, {name: "evil/pwned", typ: tar.TypeReg, data: "x"}}, wantErr: "symlink"},
		{name: "symlink-parent-rel", ents: []entry{{name: "a/", typ: tar.TypeDir, mode: 0o755}, {name: "a/evil", typ: tar.TypeSymlink, link: up}, {name: "a/evil/" + strings.TrimPrefix(outside, "/") + "/pwned", typ: tar.TypeReg, data: "x"}}, wantErr: "symlink"},
		{name: "symlink-then-dir", ents: []entry{{name: "evil", typ: tar.TypeSymlink, link: outside}, {name: "evil/sub/", typ: tar.TypeDir, mode: 0o755}}, wantErr: "symlink"},
		{name: "file-over-symlink", ents: []entry{{name: "evil", typ: tar.TypeSymlink, link: outside + "/secret"}, {name: "evil", typ: tar.TypeReg, data: "overwritten"}},
			check: func(t *testing.T, root string) {
				if b, _ := os.ReadFile(filepath.Join(root, "evil")); string(b) != "overwritten" {
					t.Fatalf("file replacing a symlink: %q", b)
				}
			}},
		{name: "hardlink-dotdot", ents: []entry{{name: "hl", typ: tar.TypeLink, link: up + strings.TrimPrefix(outside, "/") + "/secret"}}, wantErr: "'..'"},
		{name: "hardlink-absolute", ents: []entry{{name: "hl", typ: tar.TypeLink, link: outside + "/secret"}}, wantErr: "not in the layer"},
		{name: "hardlink-through-symlink", ents: []entry{{name: "evil", typ: tar.TypeSymlink, link: outside}, {name: "hl", typ: tar.TypeLink, link: "evil/secret"}}, wantErr: "symlink"},
		{name: "hardlink-to-dir", ents: []entry{{name: "d/", typ: tar.TypeDir, mode: 0o755}, {name: "hl", typ: tar.TypeLink, link: "d"}}, wantErr: "not a regular file"},
		{name: "char-device", ents: []entry{{name: "dev/mem", typ: tar.TypeChar, major: 1, mode: 0o666}}, wantErr: "device nodes are not allowed"},
		{name: "block-device", ents: []entry{{name: "sda", typ: tar.TypeBlock, major: 8, mode: 0o666}}, wantErr: "device nodes are not allowed"},
		{name: "whiteout-dotdot", ents: []entry{{name: "a/.wh..", typ: tar.TypeReg}}, wantErr: "no name to hide"},
		{name: "whiteout-through-symlink", ents: []entry{{name: "evil", typ: tar.TypeSymlink, link: outside}, {name: "evil/.wh.secret", typ: tar.TypeReg}}, wantErr: "symlink"},
		{name: "opaque-through-symlink", ents: []entry{{name: "evil", typ: tar.TypeSymlink, link: outside}, {name: "evil/.wh..wh..opq", typ: tar.TypeReg}}, wantErr: "symlink"},
		{name: "sparse-10gb", ents: []entry{{name: "sparse", typ: tar.TypeReg, size: 10 << 30}}, wantErr: "cap of 8388608 bytes"},
		{name: "decompression-bomb", ents: []entry{{name: "zeros", typ: tar.TypeReg, data: zeros}}, wantErr: "cap of 8388608 bytes"},
		{name: "inode-bomb", ents: many, wantErr: "cap of 1000 files"},
	}
	s, dir := openStore(t, imagestore.Limits{MaxBytes: 8 << 20, MaxFiles: 1000})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ref := push(t, reg, "hostile/"+c.name+":v1", imageOf(t, tarLayer(t, c.ents...)))
			img, err := s.Pull(context.Background(), ref, imagestore.PullOptions{})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("pull: %v, want an error containing %q", err, c.wantErr)
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
