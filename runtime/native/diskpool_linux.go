package native

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// OpenDiskPool keeps up to size ready disks per disk size in dir (those
// of a size are first made when a start asks for one). Leftovers of an
// earlier pool in dir are removed (ReclaimDiskPool). dir is
// bind-mounted on itself with private propagation, so that its disks can
// be moved to their sandboxes under a shared mount. Close removes it all.
func OpenDiskPool(dir string, size int) (*DiskPool, error) {
	if size <= 0 {
		return nil, errors.New("disk pool: size must be positive")
	}
	if err := ReclaimDiskPool(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("disk pool: %w", err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("disk pool: bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return nil, fmt.Errorf("disk pool: make %s private: %w", dir, err)
	}
	return &DiskPool{dir: dir, size: size, ready: map[diskKey][]string{}, filling: map[diskKey]bool{}}, nil
}

// ReclaimDiskPool removes what a pool in dir left, the pool of a server
// killed with SIGKILL say: every mount at or under dir (the ready disks,
// then the directory's own bind mount, however often it is stacked), which
// detaches the disks' loop devices (they clear themselves once unmounted),
// then the disk files and the directory. A server calls it on start, before
// it opens a pool in dir, so that a crash leaves nothing mounted past the
// next start whether or not an image sandbox is created. A missing dir is
// not an error.
func ReclaimDiskPool(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("disk pool: %w", err)
	}
	for range 64 { // each pass unmounts the top mount of each mount point
		mounts, err := mountsUnder(dir)
		if err != nil {
			return fmt.Errorf("disk pool: %w", err)
		}
		if len(mounts) == 0 {
			break
		}
		for _, m := range mounts { // deepest first
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("disk pool: unmount %s: %w", m, err)
			}
		}
	}
	if mounts, _ := mountsUnder(dir); len(mounts) > 0 {
		return fmt.Errorf("disk pool: %s stays mounted", mounts[0])
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("disk pool: %w", err)
	}
	return nil
}

// mountsUnder lists this mount namespace's mount points at or under dir,
// deepest first.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out, nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Close stops filling the pool and removes its disks.
func (p *DiskPool) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	return ReclaimDiskPool(p.dir)
}

// Ready reports how many disks of size bytes and inodes inodes are ready.
func (p *DiskPool) Ready(size, inodes int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready[diskKey{max(size, minQuotaDisk), max(inodes, 64)}])
}

// take moves a ready disk of key to dir (mounted at dir/disk; its image
// file, unlinked from the pool, lives as long as the loop device) with its
// upper directory owned by base. It reports false when none was ready or
// the move failed (the caller then makes the disk itself). Either way the
// caller calls refill once its sandbox runs: a refill (mkfs, a loop
// device, a mount) started beside the create would compete with it for
// the CPUs and the kernel's mount and RCU work (docs/images.md).
func (p *DiskPool) take(key diskKey, dir string, base int) (disk string, ok bool, refill func()) {
	p.mu.Lock()
	var ent string
	if l := p.ready[key]; len(l) > 0 {
		ent, p.ready[key] = l[len(l)-1], l[:len(l)-1]
	}
	p.mu.Unlock()
	refill = func() {
		p.mu.Lock()
		p.fillLocked(key)
		p.mu.Unlock()
		if ent != "" {
			_ = os.RemoveAll(ent) // the unlinked image lives on with its loop device
		}
	}
	if ent == "" {
		return "", false, refill
	}
	disk = filepath.Join(dir, "disk")
	err := os.MkdirAll(disk, 0o700)
	if err == nil {
		err = unix.Mount(filepath.Join(ent, "disk"), disk, "", unix.MS_MOVE, "")
	}
	if err != nil {
		_ = unix.Unmount(filepath.Join(ent, "disk"), unix.MNT_DETACH)
		return "", false, refill
	}
	if err := os.Chown(filepath.Join(disk, "upper"), base, base); err != nil {
		_ = unix.Unmount(disk, unix.MNT_DETACH)
		return "", false, refill
	}
	return disk, true, refill
}

// fillLocked starts filling key's list up to the pool's size, unless a
// filler runs already. p.mu is held.
func (p *DiskPool) fillLocked(key diskKey) {
	if p.closed || p.filling[key] || len(p.ready[key]) >= p.size {
		return
	}
	p.filling[key] = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// The fill runs beside the create that took a disk, on the same
		// CPUs: at the lowest priority (nice is per thread on Linux, and
		// mkfs inherits it), so that it takes what the create leaves. The
		// thread is locked and never unlocked: it ends with the goroutine
		// instead of going back to the runtime niced.
		runtime.LockOSThread()
		_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
		for {
			p.mu.Lock()
			if p.closed || len(p.ready[key]) >= p.size {
				p.filling[key] = false
				p.mu.Unlock()
				return
			}
			p.seq++
			ent := filepath.Join(p.dir, strconv.Itoa(p.seq))
			p.mu.Unlock()
			if err := makeUpperDisk(ent, key.size, key.inodes); err != nil {
				_ = os.RemoveAll(ent)
				p.mu.Lock()
				p.filling[key] = false
				p.mu.Unlock()
				return // the next take tries again; creates make their own meanwhile
			}
			p.mu.Lock()
			p.ready[key] = append(p.ready[key], ent)
			p.mu.Unlock()
		}
	}()
}

// makeUpperDisk makes dir/disk.img, a fresh capped filesystem, mounted at
// dir/disk with empty upper/ (owned by root until taken) and work/.
func makeUpperDisk(dir string, size, inodes int64) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	img := filepath.Join(dir, "disk.img")
	disk := filepath.Join(dir, "disk")
	if err := MakeDisk(img, size, inodes, 0, false); err != nil {
		return err
	}
	if err := MountDisk(img, disk); err != nil {
		return err
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(disk, d), 0o755); err != nil {
			unix.Unmount(disk, unix.MNT_DETACH)
			return err
		}
	}
	return nil
}
