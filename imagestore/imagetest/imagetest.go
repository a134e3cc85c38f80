// Package imagetest builds OCI images and runs a registry on 127.0.0.1 for
// tests of the image store and of sandboxes made from images.
package imagetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry of a layer built by a test.
type Entry struct {
	Name, Link string
	Type       byte
	Mode       int64
	Data       string
	Size       int64 // header size when Data is not written (a lying header)
	UID        int
	Major      int64
}

// TarLayer builds an uncompressed layer tar from entries, exactly as given
// (no cleaning: hostile names stay hostile).
func TarLayer(t testing.TB, ents ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.Name, Linkname: e.Link, Typeflag: e.Type, Mode: e.Mode, Uid: e.UID, Gid: e.UID,
			Devmajor: e.Major, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.Type == tar.TypeReg {
			h.Size = int64(len(e.Data))
		}
		if e.Size > 0 {
			// A header whose data never follows: only the header is
			// written, as a bomb's would be streamed.
			h.Size = e.Size
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			tw.Flush()
			return buf.Bytes()
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.Type == tar.TypeReg {
			io.WriteString(tw, e.Data)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Layer makes a layer (gzip-compressed when written) of a tar.
func Layer(t testing.TB, raw []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image is a linux/amd64 image of the given layer tars (PATH and
// IMAGE=test in its env).
func Image(t testing.TB, layers ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, raw := range layers {
		var err error
		if img, err = mutate.AppendLayers(img, Layer(t, raw)); err != nil {
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

// Registry starts go-containerregistry's registry on 127.0.0.1.
func Registry(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// Push writes img to reg/repo and returns the full reference.
func Push(t testing.TB, reg, repo string, img v1.Image) string {
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

// Busybox is an image of Debian's static busybox (/bin/busybox, /bin/sh),
// /etc/image-marker ("from the image\n"), /usr/local owned by the image's
// root (0755), /home/app owned by 1000 (0700), and /etc/gone which its top
// layer whites out. It skips t without /bin/busybox (busybox-static).
func Busybox(t testing.TB) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs busybox-static (scripts/setup.sh): ", err)
	}
	base := TarLayer(t,
		Entry{Name: "bin/", Type: tar.TypeDir, Mode: 0o755},
		Entry{Name: "bin/busybox", Type: tar.TypeReg, Mode: 0o755, Data: string(bb)},
		Entry{Name: "bin/sh", Type: tar.TypeSymlink, Link: "busybox"},
		Entry{Name: "etc/", Type: tar.TypeDir, Mode: 0o755},
		Entry{Name: "etc/image-marker", Type: tar.TypeReg, Mode: 0o644, Data: "from the image\n"},
		Entry{Name: "etc/gone", Type: tar.TypeReg, Mode: 0o644, Data: "hidden by the top layer\n"},
		Entry{Name: "usr/", Type: tar.TypeDir, Mode: 0o755},
		Entry{Name: "usr/local/", Type: tar.TypeDir, Mode: 0o755},
		Entry{Name: "home/app/", Type: tar.TypeDir, Mode: 0o700, UID: 1000},
	)
	top := TarLayer(t, Entry{Name: "etc/.wh.gone", Type: tar.TypeReg})
	return Image(t, base, top)
}

// TreeSig lists every path under dir with its mode, owner, size and mtime,
// to compare a tree before and after.
func TreeSig(t testing.TB, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(&b, "%s %s %d:%d %d %s\n", strings.TrimPrefix(p, dir), fi.Mode(), st.Uid, st.Gid, fi.Size(), fi.ModTime())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
