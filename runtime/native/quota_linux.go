package native

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// minQuotaDisk is the smallest upper filesystem made (ext4's own overhead
// needs a few hundred KiB).
const minQuotaDisk = 4 << 20

// mkfsPaths are where e2fsprogs' mkfs.ext4 is looked for.
var mkfsPaths = []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"}

// quotaDisk gives an image sandbox's writes a filesystem of their own,
// capped at size bytes and inodes files: an ext4 image in dir (sparse, so it
// costs only what is written), on a loop device that frees itself
// (autoclear) when the last mount of it goes, mounted at dir/disk with
// upper/ (owned by the sandbox's root, host uid base) and work/ in it. The
// sandbox reaches it only through the kernel's ext4 and overlayfs, never
// the image file, so it cannot craft the filesystem it runs on. A ready
// disk of pool (if any) is taken when there is one; then after is not nil
// and the caller calls it once the sandbox runs (it starts the pool's
// refill).
func quotaDisk(dir string, size, inodes int64, base int, pool *DiskPool) (disk string, after func(), err error) {
	disk = filepath.Join(dir, "disk")
	_ = unix.Unmount(disk, unix.MNT_DETACH) // leftovers of a crashed launcher
	_ = os.Remove(filepath.Join(dir, "disk.img"))
	key := diskKey{max(size, minQuotaDisk), max(inodes, 64)}
	if pool != nil {
		d, ok, refill := pool.take(key, dir, base)
		if ok {
			return d, refill, nil
		}
		after = refill
	}
	if err := makeUpperDisk(dir, key.size, key.inodes); err != nil {
		return "", after, err
	}
	if err := os.Chown(filepath.Join(disk, "upper"), base, base); err != nil {
		unix.Unmount(disk, unix.MNT_DETACH)
		return "", after, err
	}
	return disk, after, nil
}

// MakeDisk creates img (which must not exist): a sparse file of size
// bytes holding an empty ext4 filesystem with inodes inodes, its root
// directory owned by owner (mode 0777 if shared, else 0755). Without a
// journal: what it holds is scratch or, for volumes, synced by the kernel
// on unmount.
func MakeDisk(img string, size, inodes int64, owner int, shared bool) error {
	size = max(size, minQuotaDisk)
	inodes = max(inodes, 64)
	mkfs := ""
	for _, p := range mkfsPaths {
		if _, err := os.Stat(p); err == nil {
			mkfs = p
			break
		}
	}
	if mkfs == "" {
		return errors.New("capped disks (image roots, volumes) need mkfs.ext4 (Debian: e2fsprogs)")
	}
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("disk image %s: %w", img, err)
	}
	out, err := exec.Command(mkfs, "-q", "-F", "-m", "0", "-N", strconv.FormatInt(inodes, 10), "-O", "^has_journal",
		"-E", fmt.Sprintf("lazy_itable_init=1,nodiscard,root_owner=%d:%d", owner, owner), img).CombinedOutput()
	if err != nil {
		os.Remove(img)
		return fmt.Errorf("mkfs.ext4 %s: %v: %s", img, err, out)
	}
	if shared {
		// The root of a shared disk is writable by every sandbox user,
		// sticky like /tmp.
		return MountDiskThen(img, func(dir string) error { return os.Chmod(dir, 0o1777) })
	}
	return nil
}

// MountDisk mounts the ext4 image img at dir (nosuid, nodev, noatime) on a
// loop device that detaches itself once unmounted everywhere.
func MountDisk(img, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	dev, err := attachLoop(int(f.Fd()))
	if err != nil {
		return err
	}
	defer unix.Close(dev.fd)
	if err := unix.Mount(dev.path, dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "noinit_itable"); err != nil {
		return fmt.Errorf("mount %s (%s) at %s: %w", dev.path, img, dir, err)
	}
	return nil
}

// MountDiskThen mounts img on a private temporary directory, runs fn on
// it, and unmounts it.
func MountDiskThen(img string, fn func(dir string) error) error {
	dir, err := os.MkdirTemp(filepath.Dir(img), ".mnt-")
	if err != nil {
		return err
	}
	defer os.Remove(dir)
	if err := MountDisk(img, dir); err != nil {
		return err
	}
	err = fn(dir)
	if uerr := unix.Unmount(dir, 0); err == nil && uerr != nil {
		err = fmt.Errorf("unmount %s: %w", dir, uerr)
	}
	return err
}

type loopDev struct {
	path string
	fd   int
}

// attachLoop binds the file open at fd to a free loop device, with
// autoclear: the device detaches once nothing holds it open or mounted.
func attachLoop(fd int) (loopDev, error) {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return loopDev{}, fmt.Errorf("loop devices: %w", err)
	}
	defer unix.Close(ctl)
	var last error
	for range 16 { // another process may take the free device first
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return loopDev{}, fmt.Errorf("loop devices: %w", err)
		}
		path := fmt.Sprintf("/dev/loop%d", n)
		lfd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return loopDev{}, fmt.Errorf("open %s: %w", path, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(fd), Size: 512}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		if err := unix.IoctlLoopConfigure(lfd, &cfg); err != nil {
			unix.Close(lfd)
			last = err
			if errors.Is(err, unix.EBUSY) {
				continue
			}
			return loopDev{}, fmt.Errorf("configure %s: %w", path, err)
		}
		return loopDev{path: path, fd: lfd}, nil
	}
	return loopDev{}, fmt.Errorf("no free loop device: %w", last)
}
