package microvm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// minUpperDisk is the smallest writable upper disk of an image root.
const minUpperDisk = 64 << 20

// RootImage returns the path of the read-only EROFS image of an image's
// layers (unpacked directories in overlayfs form, lowest first, as
// imagestore lists them), building it at first use. The layers are
// flattened by the host's overlayfs (mounted read-only in a mount
// namespace of mkfs.erofs's own, so the mount is never visible to
// anything else), which applies their whiteouts, and the merged tree is
// written with its owners, modes and extended attributes. Layer
// directories are content-addressed (their paths name their digests), so
// the image is cached by their list.
func RootImage(layers []string) (string, error) {
	if len(layers) == 0 {
		return "", fmt.Errorf("microvm: image root without layers")
	}
	for _, l := range layers {
		if !filepath.IsAbs(l) || strings.ContainsAny(l, ":,\n") {
			return "", fmt.Errorf("microvm: layer directory %q cannot be an overlayfs lower directory", l)
		}
	}
	h := sha256.New()
	fmt.Fprintf(h, "layers\n%s\n", strings.Join(layers, "\n"))
	path := filepath.Join(CacheDir, "rootfs-"+hex.EncodeToString(h.Sum(nil))[:24]+".erofs")
	if err := ensureCacheDir(); err != nil {
		return "", err
	}
	if cached(path) {
		return path, nil
	}
	tmp, err := os.CreateTemp(CacheDir, ".rootfs-*")
	if err != nil {
		return "", fmt.Errorf("microvm: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	mnt, err := os.MkdirTemp("", "airlock-rootfs-")
	if err != nil {
		return "", fmt.Errorf("microvm: %w", err)
	}
	defer os.Remove(mnt)
	src := layers[0]
	script := `exec mkfs.erofs --quiet "$1" "$2"`
	if len(layers) > 1 {
		// overlayfs lists the upper-most lower directory first.
		lower := make([]string, len(layers))
		for i, l := range layers {
			lower[len(layers)-1-i] = l
		}
		src = mnt
		script = `mount -t overlay overlay -o "ro,lowerdir=$3" "$2" && exec mkfs.erofs --quiet "$1" "$2"`
		script = strings.Replace(script, "$3", strings.Join(lower, ":"), 1)
	}
	cmd := exec.Command("/bin/sh", "-c", script, "sh", tmp.Name(), src)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	// A mount namespace of its own: the overlay goes with the process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("microvm: image root: mkfs.erofs of %d layers: %v: %s", len(layers), err, strings.TrimSpace(string(out)))
	}
	// QEMU runs unprivileged and opens it read-only; the layers it holds
	// are readable by every sandbox of the image anyway.
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return "", fmt.Errorf("microvm: image root: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("microvm: image root: %w", err)
	}
	pruneCache("rootfs-*.erofs")
	return path, nil
}

// upperDisk makes the sandbox's writable upper disk in dir: a sparse file
// of size bytes with an empty ext4 filesystem, which the guest mounts as
// its root overlay's upper layer (and /workspace, on the same disk, shares
// its cap). It is opened here and handed to QEMU as a file descriptor, so
// QEMU needs no path to it; the host never mounts it (its content is the
// guest's).
func upperDisk(dir string, size int64) (*os.File, error) {
	if size < minUpperDisk {
		size = minUpperDisk
	}
	path := filepath.Join(dir, upperDiskFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("microvm: upper disk: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("microvm: upper disk: %w", err)
	}
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "root_owner=0:0", path).CombinedOutput()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("microvm: upper disk: mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return f, nil
}
