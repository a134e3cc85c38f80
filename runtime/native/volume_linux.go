package native

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
)

// attachVolumes attaches, for each volume, an ID-mapped clone of its
// directory (on-disk ids 0-65535 shown as the sandbox's host range base..)
// at a private staging directory and adds it to p's mounts, read-write at
// its target. The returned func detaches the clones from the host once the
// child has its own copies.
func attachVolumes(p *policy.Policy, vols []VolumeMount, base int, id string) (func(), error) {
	if len(vols) == 0 {
		return func() {}, nil
	}
	if os.Geteuid() != 0 || base == 0 {
		return nil, errors.New("volumes need airlock to run as root (they are ID-mapped mounts made from the host)")
	}
	root, err := stagingDir()
	if err != nil {
		return nil, err
	}
	stage := filepath.Join(filepath.Dir(root), "volumes", id)
	var attached []string
	undo := func() {
		for _, a := range attached {
			_ = unix.Unmount(a, unix.MNT_DETACH)
		}
		os.RemoveAll(stage)
	}
	userns, err := rangeUserns(base)
	if err != nil {
		return nil, err
	}
	defer unix.Close(userns)
	for i, v := range vols {
		at := filepath.Join(stage, strconv.Itoa(i))
		if err := os.MkdirAll(at, 0o700); err != nil {
			undo()
			return nil, err
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, v.Dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			undo()
			return nil, fmt.Errorf("volume %s: open_tree: %w", v.Dir, err)
		}
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Userns_fd: uint64(userns)}
		err = unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr)
		if err == nil {
			err = unix.MoveMount(fd, "", unix.AT_FDCWD, at, unix.MOVE_MOUNT_F_EMPTY_PATH)
		}
		unix.Close(fd)
		if err != nil {
			undo()
			return nil, fmt.Errorf("volume %s: ID-mapped mount: %w", v.Dir, err)
		}
		attached = append(attached, at)
		n := len(p.Filesystem.Mounts) // never append into the caller's array
		p.Filesystem.Mounts = append(p.Filesystem.Mounts[:n:n], policy.Mount{Source: at, Target: v.Target, Writable: true})
	}
	return undo, nil
}
