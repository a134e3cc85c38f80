package native

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
)

// imagePolicy drops the host-derived parts of the root from p: an image
// sandbox sees the image's /usr, not the host's.
func imagePolicy(p *policy.Policy) {
	p.Filesystem.ReadOnly, p.Filesystem.Hidden, p.Filesystem.EtcFiles = nil, nil, nil
}

// overlayRoot is an image root mounted on the host for one sandbox start.
type overlayRoot struct {
	merged    string
	disk      string   // the upper filesystem's mount point
	quota     string   // its size, for the enforced layer
	workspace bool     // /workspace is on it, not a tmpfs
	dirs      []string // top-level directories of the root the sandbox may write
	// fds are the detached ID-mapped layer mounts and the overlay's mount
	// fd: closing one unmounts it, which waits for an expedited RCU grace
	// period, so they are closed by detach, once the sandbox runs.
	fds []int
	// after, when set, runs in detach too (the disk pool's refill).
	after func()
}

// detach removes the host's view of the root once the child has its own
// copy (its mount namespace, made private, keeps the overlay alive). The
// upper filesystem stays mounted on the host, at ImageRoot.Dir/disk, so
// that the sandbox's changes can be read (snapshots) while it runs and
// after a server restart; RemoveImageRoot unmounts it, and the loop device
// clears itself once the sandbox's mounts are gone too.
func (o *overlayRoot) detach() {
	if o == nil {
		return
	}
	_ = unix.Unmount(o.merged, unix.MNT_DETACH)
	o.release()
}

// release closes the detached mounts' fds and starts the pool's refill,
// leaving the overlay mounted at merged.
func (o *overlayRoot) release() {
	for _, fd := range o.fds {
		unix.Close(fd)
	}
	o.fds = nil
	if o.after != nil {
		go o.after()
		o.after = nil
	}
}

// abort undoes a root that failed to build.
func (o *overlayRoot) abort() {
	o.detach()
	_ = unix.Unmount(o.disk, unix.MNT_DETACH)
}

// RemoveImageRoot unmounts an ImageRoot's upper filesystem from the host
// and removes its directory, after its sandbox ended.
func RemoveImageRoot(dir string) error {

	_ = unix.Unmount(filepath.Join(dir, "merged"), unix.MNT_DETACH)
	_ = unix.Unmount(filepath.Join(dir, "disk"), unix.MNT_DETACH)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove image root %s: %w", dir, err)
	}
	return nil
}

// Top-level paths of an image root that stay read-only to Landlock (they
// are mounts airlock makes, or the kernel's).
var imageRootFixed = map[string]bool{"proc": true, "dev": true, "sys": true, ".airlock": true, ".airlock-mnt": true}

// imageRootDirs are made in an image root that lacks them.
var imageRootDirs = []string{"home", "mnt", "opt", "root", "run", "srv", "usr", "var"}

// imageTree mounts the overlay for img on the host and returns a copy of t
// that uses it as the root: the template t built (mount points and the
// synthesized /etc files) is the top lower layer, then the image's layers;
// every lower layer is an ID-mapped mount onto the sandbox's host range
// (base), so files the image owns as uid N appear owned by uid N inside.
// The root is writable (nosuid, nodev); writes land in img.Dir/upper.
func imageTree(t *treeBuilder, img *ImageRoot, base int, p *policy.Policy) (*treeBuilder, *overlayRoot, error) {
	return mountImageTree(t, img, base, true, p)
}

// mountImageTree is imageTree; with mapped false the lower layers are not
// ID-mapped and base is 0: files keep their on-disk ids (0-65535, the
// sandbox's own), for a runtime whose file server shows the sandbox host
// ids as they are (ImageLayout).
func mountImageTree(t *treeBuilder, img *ImageRoot, base int, mapped bool, p *policy.Policy) (*treeBuilder, *overlayRoot, error) {
	lim := &p.Limits
	if os.Geteuid() != 0 || (mapped && base == 0) {
		return nil, nil, errors.New("image roots need airlock to run as root (the overlay and its ID-mapped layers are mounted from the host)")
	}
	if len(img.Layers) == 0 || img.Dir == "" {
		return nil, nil, errors.New("image root without layers or directory")
	}
	merged := filepath.Join(img.Dir, "merged")
	_ = unix.Unmount(merged, unix.MNT_DETACH) // a leftover from a crashed launcher
	if err := os.MkdirAll(merged, 0o755); err != nil {
		return nil, nil, err
	}
	disk, after, err := quotaDisk(img.Dir, lim.DiskBytes, lim.Inodes, base, img.Disks)
	if err != nil {
		if after != nil {
			go after()
		}
		return nil, nil, err
	}
	ov := &overlayRoot{merged: merged, disk: disk, after: after, quota: fmt.Sprintf("%d bytes, %d inodes", max(lim.DiskBytes, minQuotaDisk), max(lim.Inodes, 64))}
	ok := false
	defer func() {
		if !ok {
			ov.abort()
		}
	}()

	userns := -1
	if mapped {
		if userns, err = rangeUserns(base); err != nil {
			return nil, nil, err
		}
		defer unix.Close(userns)
	}
	idmapped := func(dir string, ro bool) (string, error) {
		if !mapped {
			return dir, nil // read-only as a lower layer; nosuid, nodev on the overlay
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return "", fmt.Errorf("open_tree %s: %w", dir, err)
		}
		ov.fds = append(ov.fds, fd)
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Userns_fd: uint64(userns)}
		if ro {
			attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return "", fmt.Errorf("ID-mapped mount of %s: %w", dir, err)
		}
		return fmt.Sprintf("/proc/self/fd/%d", fd), nil
	}

	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("overlayfs: %w", err)
	}
	defer unix.Close(fsfd)
	set := func(key, val string) error {
		if err := unix.FsconfigSetString(fsfd, key, val); err != nil {
			return fmt.Errorf("overlayfs %s=%s: %w%s", key, val, err, fsLog(fsfd))
		}
		return nil
	}
	if err := set("source", "airlock-image"); err != nil {
		return nil, nil, err
	}
	lowers := append(append(reversed(img.Above), t.root), reversed(img.Layers)...) // top first
	for _, l := range lowers {
		p, err := idmapped(l, true)
		if err != nil {
			return nil, nil, err
		}
		if err := set("lowerdir+", p); err != nil {
			return nil, nil, err
		}
	}
	// The top-level directories the layers lack (see below), and
	// /workspace on the disk, are made in the still empty upper directory
	// before the overlay is mounted when the layers are known: an upper
	// directory with nothing below it is what a mkdir through the overlay
	// would leave, and ext4 alone makes it faster than the overlay's
	// create and copy-up.
	key := strings.Join(lowers, "\x00")
	rootListings.Lock()
	lst, known := rootListings.m[key]
	rootListings.Unlock()
	diskWorkspace := p.Filesystem.Workspace == ""
	if known {
		upper := filepath.Join(disk, "upper")
		mk := func(name string, uid, gid int) error {
			d := filepath.Join(upper, name)
			if err := os.Mkdir(d, 0o755); err != nil {
				return fmt.Errorf("image root: %w", err)
			}
			if err := os.Lchown(d, uid, gid); err != nil {
				return fmt.Errorf("image root: %w", err)
			}
			return nil
		}
		for _, d := range lst.missing {
			if err := mk(d, base, base); err != nil {
				return nil, nil, err
			}
		}
		if diskWorkspace {
			if err := mk("workspace", base+p.User.UID, base+p.User.GID); err != nil {
				return nil, nil, err
			}
		}
	}
	// The upper directory is not ID-mapped: overlayfs creates its work
	// directory and copies up with the mounter's credentials (host root),
	// which a mapping onto the sandbox's range cannot represent
	// (EOVERFLOW). Files there carry host ids of the sandbox's range; its
	// root directory belongs to the sandbox's root (quotaDisk).
	if err := set("upperdir", filepath.Join(disk, "upper")); err != nil {
		return nil, nil, err
	}
	if err := set("workdir", filepath.Join(disk, "work")); err != nil {
		return nil, nil, err
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, nil, fmt.Errorf("overlayfs: %w%s", err, fsLog(fsfd))
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, nil, fmt.Errorf("overlayfs mount: %w%s", err, fsLog(fsfd))
	}
	ov.fds = append(ov.fds, mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, merged, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return nil, nil, fmt.Errorf("attach overlayfs at %s: %w", merged, err)
	}
	// Landlock rules are fixed before the program starts, so the usual
	// top-level directories exist (made in the upper directory, owned by
	// the sandbox's root) for the sandbox to write under. Which are
	// missing, and the root's directories after, depend only on the
	// (immutable) lower layers, since every upper directory starts empty:
	// they are looked up once per set of layers.
	if !known {
		for _, d := range imageRootDirs {
			if _, err := os.Lstat(filepath.Join(merged, d)); os.IsNotExist(err) {
				lst.missing = append(lst.missing, d)
			}
		}
		for _, d := range lst.missing {
			p := filepath.Join(merged, d)
			if err := os.Mkdir(p, 0o755); err != nil {
				return nil, nil, fmt.Errorf("image root: %w", err)
			}
			if err := os.Lchown(p, base, base); err != nil {
				return nil, nil, fmt.Errorf("image root: %w", err)
			}
		}
		ents, err := os.ReadDir(merged)
		if err != nil {
			return nil, nil, err
		}
		for _, e := range ents {
			if e.IsDir() && !imageRootFixed[e.Name()] {
				lst.dirs = append(lst.dirs, "/"+e.Name())
			}
		}
		rootListings.Lock()
		if len(rootListings.m) >= 1024 {
			clear(rootListings.m)
		}
		if rootListings.m == nil {
			rootListings.m = map[string]rootListing{}
		}
		rootListings.m[key] = lst
		rootListings.Unlock()
	}
	ov.dirs = lst.dirs

	// /workspace is a directory of the root, on the capped disk, instead
	// of a tmpfs charged to the memory limit (unless a host directory is
	// bound there).
	if diskWorkspace && !known {
		if err := os.Lchown(filepath.Join(merged, "workspace"), base+p.User.UID, base+p.User.GID); err != nil {
			return nil, nil, fmt.Errorf("image root: /workspace: %w", err)
		}
	}
	ov.workspace = diskWorkspace

	// The same mounts, on the overlay instead of the template.
	n := *t
	n.root = merged
	n.ops = []op{{src: cstr(merged), path: cstr(merged), flags: unix.MS_BIND | unix.MS_REC}}
	n.steps = []string{t.steps[0]}
	n.opPaths = nil
	for i, o := range t.ops[1:] {
		at := t.opPaths[i]
		if diskWorkspace && at == "/workspace" && goString(o.fstype) == "tmpfs" {
			continue
		}
		o.path = cstr(merged + at)
		n.ops = append(n.ops, o)
		n.steps = append(n.steps, t.steps[i+1])
		n.opPaths = append(n.opPaths, at)
	}
	n.remount = append([]op{}, t.remount...)
	n.rsteps = append([]string{}, t.rsteps...)
	last := len(n.remount) - 1 // buildTree's "remount / read-only": writable here
	if last < 0 || n.rsteps[last] != "remount / read-only" {
		return nil, nil, errors.New("image root: the root tree does not end with the root's remount")
	}
	n.remount[last] = op{path: cstr("/"), flags: unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV | lockedFlags(merged)&^unix.MS_RDONLY}
	n.rsteps[last] = "remount / (image overlay) nosuid,nodev"
	ok = true
	return &n, ov, nil
}

// rootListing is what imageTree finds at the top of a fresh image root:
// the imageRootDirs its layers lack, and its directories once those are
// made.
type rootListing struct{ missing, dirs []string }

// rootListings caches rootListing by the root's lower layers (top first,
// NUL-separated): layer directories and root templates never change once
// made.
var rootListings struct {
	sync.Mutex
	m map[string]rootListing
}

// layer describes the image root in a sandbox's enforced layers.
func (o *overlayRoot) layer(n int) rt.Layer {
	return rt.Layer{Name: "rootfs", State: rt.StateOK,
		Detail: fmt.Sprintf("image: overlayfs of %d read-only ID-mapped layers and a per-sandbox upper directory on disk (ext4 on a loop device, capped at %s%s; nosuid, nodev); writable under %s", n, o.quota, map[bool]string{true: ", /workspace on it"}[o.workspace], strings.Join(o.dirs, " "))}
}

// landlockRules lets the sandbox write under every top-level directory of
// its image root (not /proc, /dev, /sys or airlock's own).
func (o *overlayRoot) landlockRules(attr []byte) []llRule {
	if o == nil || len(attr) < 8 {
		return nil
	}
	handled := binary.LittleEndian.Uint64(attr[0:])
	var rules []llRule
	for _, d := range o.dirs {
		var r llRule
		r.path = cstr(d)
		binary.LittleEndian.PutUint64(r.attr.raw[0:], handled)
		rules = append(rules, r)
	}
	return rules
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

// fsLog reads the messages the kernel left on a filesystem context.
func fsLog(fd int) string {
	var msgs []string
	buf := make([]byte, 4096)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	if len(msgs) == 0 {
		return ""
	}
	return " (" + strings.Join(msgs, "; ") + ")"
}

// rangeUserns returns a user namespace fd whose uids and gids 0-65535 map
// to host base..base+65535, for ID-mapped mounts (idmapUserns); the caller
// closes it. Making one starts a helper process (a fork and an execve of
// this binary: a large part of an image create), so the namespaces of the
// last rangeUsernsCached bases are kept open and handed out as duplicates:
// a namespace without processes is only a mapping, the same for every
// sandbox of that range.
func rangeUserns(base int) (int, error) {
	usernsCache.Lock()
	defer usernsCache.Unlock()
	fd, ok := usernsCache.fds[base]
	if !ok {
		m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: 65536}}
		var err error
		if fd, err = idmapUserns(m, m); err != nil {
			return -1, err
		}
		if usernsCache.fds == nil {
			usernsCache.fds = map[int]int{}
		}
		if len(usernsCache.order) >= rangeUsernsCached {
			old := usernsCache.order[0]
			usernsCache.order = usernsCache.order[1:]
			unix.Close(usernsCache.fds[old])
			delete(usernsCache.fds, old)
		}
		usernsCache.fds[base] = fd
		usernsCache.order = append(usernsCache.order, base)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return -1, fmt.Errorf("user namespace for ID-mapped mounts: %w", err)
	}
	return dup, nil
}

// rangeUsernsCached is how many ranges' user namespaces rangeUserns keeps.
const rangeUsernsCached = 64

// usernsCache holds rangeUserns's namespaces by range base, oldest first in
// order.
var usernsCache struct {
	sync.Mutex
	fds   map[int]int
	order []int
}

// idmapUserns returns a user namespace fd with the given uid and gid maps,
// for ID-mapped mounts (on-disk id ContainerID appears as HostID).
func idmapUserns(uids, gids []syscall.SysProcIDMap) (int, error) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: uids, GidMappings: gids,
		GidMappingsEnableSetgroups: false, Ptrace: true, Pdeathsig: syscall.SIGKILL}
	// The child traces itself (PTRACE_TRACEME) against the thread that
	// cloned it: that thread must not meanwhile run forkAs, which lends it
	// a sandbox's uid (without CAP_SYS_PTRACE) for the length of a clone;
	// the child then failed with EPERM in bursts of image creates.
	runtime.LockOSThread()
	err := cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return -1, fmt.Errorf("user namespace for ID-mapped mounts: %w", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("user namespace for ID-mapped layers: %w", err)
	}
	return fd, nil
}
