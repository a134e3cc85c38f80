package imagetest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlock-dev/airlock/debimage"
)

// DebianPackages are what DebianPython installs besides Debian's
// essential packages and apt.
var DebianPackages = []string{"python3", "python3-pip", "python3-venv"}

// mmdebstrapArgs make the root: bookworm from the host's configured Debian
// mirror, no recommends, no documentation or locales.
func mmdebstrapArgs(out string) []string {
	return []string{"--variant=apt", "--include=" + strings.Join(DebianPackages, ","),
		`--aptopt=APT::Install-Recommends "false"`,
		"--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--format=tar", "bookworm", out}
}

// CacheDir is where expensive test fixtures are kept between runs:
// $AIRLOCK_TEST_CACHE, else /var/cache/airlock-test.
func CacheDir() string {
	if d := os.Getenv("AIRLOCK_TEST_CACHE"); d != "" {
		return d
	}
	return "/var/cache/airlock-test"
}

// DebianLayer returns a gzipped layer tar of a Debian bookworm root made
// here by mmdebstrap (DebianPackages), without device nodes (the image
// store refuses them; airlock gives sandboxes their /dev), and whether it
// came from the cache. It is built once and cached in CacheDir() under a
// key of the mmdebstrap version, its arguments and the apt sources, so a
// changed mirror snapshot or package list builds a new one. Building takes
// a minute or two and needs root and mmdebstrap (scripts/setup.sh --tests).
func DebianLayer(t testing.TB) (path string, cached bool) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mmdebstrap needs root")
	}
	mm, err := exec.LookPath("mmdebstrap")
	if err != nil {
		t.Fatalf("mmdebstrap is not installed (apt-get install mmdebstrap; scripts/setup.sh --tests does): %v", err)
	}
	h := sha256.New()
	ver, _ := exec.Command(mm, "--version").Output()
	h.Write(ver)
	fmt.Fprintln(h, mmdebstrapArgs(""))
	for _, glob := range []string{"/etc/apt/sources.list", "/etc/apt/sources.list.d/*"} {
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			b, _ := os.ReadFile(f)
			fmt.Fprintln(h, f)
			h.Write(b)
		}
	}
	dir := filepath.Join(CacheDir(), "debian-"+hex.EncodeToString(h.Sum(nil))[:16])
	layer := filepath.Join(dir, "layer.tar.gz")
	if _, err := os.Stat(layer); err == nil {
		return layer, true
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// One builder at a time (test binaries of several packages may ask at
	// once); the others wait and take the result.
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(layer); err == nil {
		return layer, true
	}
	raw := filepath.Join(dir, "rootfs.tar")
	cmd := exec.Command(mm, mmdebstrapArgs(raw)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mmdebstrap: %v\n%s", err, out)
	}
	tmp := layer + ".tmp"
	if err := debimage.WithoutDevices(raw, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, layer); err != nil {
		t.Fatal(err)
	}
	os.Remove(raw)
	return layer, false
}

// DebianPython is a linux/amd64 image of DebianLayer with Debian's PATH.
func DebianPython(t testing.TB) v1.Image {
	t.Helper()
	path, _ := DebianLayer(t)
	l, err := tarball.LayerFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Cmd = []string{"/bin/bash"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}
