// Package debimage builds sandbox images from Debian packages with
// mmdebstrap: the desktop image (an X display, a window manager, the X
// tools of computer use, a VNC server with noVNC, Chromium) and the
// browser image (headless Chromium with its DevTools port). A build is
// cached by content: the key covers mmdebstrap's version, the package
// list, the files and hooks, and the host's apt sources (the mirror or
// snapshot the packages come from), so the same inputs give the cached
// image and a changed one builds anew.
package debimage

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"
)

// Spec is an image to build.
type Spec struct {
	// Name names the image ("desktop") and its cache directory.
	Name string
	// Suite is the Debian release (bookworm).
	Suite string
	// Packages are installed besides Debian's essential ones and apt,
	// without recommends.
	Packages []string
	// Files are written into the root (absolute path to content), mode
	// 0755 for paths under a bin directory, else 0644.
	Files map[string]string
	// Run is shell run in the finished root as root (chroot), e.g. to add
	// the user.
	Run []string
	// Config is the image's configuration (user, env, working dir).
	Config v1.Config
}

// mmdebstrapArgs are the arguments building s into out, given the
// directory holding its files (hooks upload them from there).
func (s *Spec) mmdebstrapArgs(files, out string) []string {
	args := []string{"--variant=apt", "--include=" + strings.Join(s.Packages, ","),
		`--aptopt=APT::Install-Recommends "false"`,
		"--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-include=/usr/share/locale/en*"}
	for _, p := range s.filePaths() {
		args = append(args, "--customize-hook=upload "+filepath.Join(files, hostName(p))+" "+p)
		mode := "0644"
		if strings.Contains(p, "/bin/") {
			mode = "0755"
		}
		args = append(args, `--customize-hook=chmod `+mode+` "$1`+p+`"`)
	}
	for _, r := range s.Run {
		args = append(args, `--customize-hook=chroot "$1" sh -ec '`+r+`'`)
	}
	// Nothing of the build's apt state is kept.
	args = append(args, `--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin`)
	return append(args, "--format=tar", s.Suite, out)
}

func (s *Spec) filePaths() []string {
	ps := make([]string, 0, len(s.Files))
	for p := range s.Files {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

func hostName(p string) string { return strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "_") }

// Key is the content key of s's build on this host.
func (s *Spec) Key(mmdebstrap string) string {
	h := sha256.New()
	ver, _ := exec.Command(mmdebstrap, "--version").Output()
	h.Write(ver)
	fmt.Fprintln(h, s.mmdebstrapArgs("FILES", "OUT"))
	for _, p := range s.filePaths() {
		fmt.Fprintf(h, "%s %d\n%s", p, len(s.Files[p]), s.Files[p])
	}
	fmt.Fprintf(h, "%+v\n", s.Config)
	for _, glob := range []string{"/etc/apt/sources.list", "/etc/apt/sources.list.d/*"} {
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			b, _ := os.ReadFile(f)
			fmt.Fprintln(h, f)
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Build returns the gzipped layer tar of s's root, without device nodes
// (airlock gives sandboxes their /dev; the image store refuses them), from
// cacheDir when built before (cached) or built now. Concurrent builders of
// the same key wait for one build. It needs root and mmdebstrap; log gets
// mmdebstrap's output.
func Build(ctx context.Context, s *Spec, cacheDir string, log io.Writer) (layer string, cached bool, err error) {
	mm, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return "", false, fmt.Errorf("mmdebstrap is not installed (apt-get install mmdebstrap; scripts/setup.sh --tests does): %w", err)
	}
	dir := filepath.Join(cacheDir, s.Name+"-"+s.Key(mm))
	layer = filepath.Join(dir, "layer.tar.gz")
	if _, err := os.Stat(layer); err == nil {
		return layer, true, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", false, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", false, fmt.Errorf("locking %s: %w", dir, err)
	}
	if _, err := os.Stat(layer); err == nil {
		return layer, true, nil
	}
	files, err := os.MkdirTemp(dir, "files-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(files)
	for p, data := range s.Files {
		if err := os.WriteFile(filepath.Join(files, hostName(p)), []byte(data), 0o644); err != nil {
			return "", false, err
		}
	}
	raw := filepath.Join(dir, "rootfs.tar")
	defer os.Remove(raw)
	cmd := exec.CommandContext(ctx, mm, s.mmdebstrapArgs(files, raw)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return "", false, fmt.Errorf("mmdebstrap %s: %w", s.Name, err)
	}
	tmp := layer + ".tmp"
	if err := WithoutDevices(raw, tmp); err != nil {
		os.Remove(tmp)
		return "", false, err
	}
	if err := os.Rename(tmp, layer); err != nil {
		return "", false, err
	}
	return layer, false, nil
}

// WithoutDevices copies the tar src to dst, gzipped, leaving out character
// and block devices.
func WithoutDevices(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	gz, _ := gzip.NewWriterLevel(out, gzip.BestSpeed)
	tw := tar.NewWriter(gz)
	tr := tar.NewReader(in)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", src, err)
		}
		if hdr.Typeflag == tar.TypeChar || hdr.Typeflag == tar.TypeBlock {
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return out.Close()
}

// Image is the linux/amd64 image of a layer built for s.
func Image(s *Spec, layer string) (v1.Image, error) {
	l, err := tarball.LayerFromFile(layer)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = s.Config
	return mutate.ConfigFile(img, cf)
}

// Archive returns a `docker save` tarball of s's image (tagged
// NAME:latest) next to its cached layer, written once: what `airlock image
// import` stores.
func Archive(s *Spec, layer string) (string, error) {
	path := filepath.Join(filepath.Dir(layer), "image.tar")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(layer), "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("locking %s: %w", layer, err)
	}
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	img, err := Image(s, layer)
	if err != nil {
		return "", err
	}
	if err := WriteArchive(img, s.Name+":latest", path+".tmp"); err != nil {
		os.Remove(path + ".tmp")
		return "", err
	}
	return path, os.Rename(path+".tmp", path)
}

// WriteArchive writes img as a `docker save` tarball tagged tag, which
// `airlock image import` stores.
func WriteArchive(img v1.Image, tag, path string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("tag %q: %w", tag, err)
	}
	return tarball.WriteToFile(path, ref, img)
}
