package native

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
)

// hostDirs is what attachHostDirs did: the ID-mapped host directories, for
// the enforced layers, and how to take the host's view of them away.
type hostDirs struct {
	desc     []string // "DIR (host uid U, gid G) at DST"
	attached []string // staging mount points, detached by undo
	stage    string
}

// mapped reports whether any host directory is ID-mapped into the sandbox
// (then its seccomp filter refuses set-uid/set-gid modes).
func (h *hostDirs) mapped() bool { return h != nil && len(h.desc) > 0 }

// undo detaches the staging mounts from the host; the sandbox's mount
// namespace keeps its copies.
func (h *hostDirs) undo() {
	if h == nil {
		return
	}
	for _, a := range h.attached {
		_ = unix.Unmount(a, unix.MNT_DETACH)
	}
	if h.stage != "" {
		os.RemoveAll(h.stage)
	}
}

// attachHostDirs makes the read-write host directories of p (its :rw
// mounts and its workspace) writable by the sandbox user without chown:
// a directory owned by host uid U and gid G, neither of them root nor the
// sandbox user's host ids already, is cloned (open_tree), ID-mapped so
// that U and G appear as the sandbox user's host uid and gid (nothing else
// is mapped: other owners show as nobody and cannot be written), made
// nosuid and nodev, attached at a private staging point and put in p in
// place of the directory. The sandbox's files there belong to U:G on the
// host. A directory owned by root that the sandbox cannot write anyway is
// refused: mapping it would let the sandbox create root-owned files on
// the host. Set-uid and set-gid modes are refused by seccomp in such
// sandboxes (the host could execute what the sandbox leaves), which the
// caller arranges when mapped() is true. Unprivileged airlock maps
// nothing (it cannot), and checkWritableMounts judges the mounts as before.
func attachHostDirs(p *policy.Policy, ids idMap, id string) (*hostDirs, error) {
	if os.Geteuid() != 0 || ids.owner <= 0 {
		return &hostDirs{}, nil
	}
	return mapHostDirs(p, ids.hostUID, ids.hostGID, -1, func() (string, error) {
		root, err := stagingDir()
		if err != nil {
			return "", err
		}
		return filepath.Join(filepath.Dir(root), "hostdirs", id), nil
	})
}

// MapHostDirs is attachHostDirs for a runtime whose sandbox user is host
// uid:gid itself, with no user namespace of airlock's around it (gVisor,
// whose gofer gives the sandbox's files its own ids on the host): a
// read-write host directory of p (its :rw mounts, its workspace) owned by
// another unprivileged host user U:G is ID-mapped so that U:G appear as
// uid:gid (and nothing else is mapped), nosuid, nodev, attached under
// directory stage (made if needed) and put in p in place of the directory.
// It returns the staging mount points, to detach (MNT_DETACH) when the
// sandbox is gone and before stage is removed, and the enforced layer's
// detail ("" if nothing was mapped). A root-owned directory the sandbox
// cannot write is refused, as for native sandboxes. airlock must be root.
//
// creator, if not -1, is the host uid and gid that the runtime's file
// server creates a file as before it gives the file its owner (gVisor's
// sentry and gofer: root, then fchown): a creation through an ID-mapped
// mount needs the creator's ids mapped, so on-disk nobody (65534) appears
// as creator too, which is what such a file is for that moment (and what
// a failed fchown leaves, before the server unlinks it).
func MapHostDirs(p *policy.Policy, uid, gid, creator int, stage string) (attached []string, detail string, err error) {
	h, err := mapHostDirs(p, uid, gid, creator, func() (string, error) { return stage, nil })
	if err != nil {
		return nil, "", err
	}
	if h.mapped() {
		detail = h.describe()
	}
	return h.attached, detail, nil
}

// mapHostDirs does attachHostDirs' mapping onto host uid hostUID and gid
// hostGID (and creator, see MapHostDirs); stage names the staging
// directory when one is needed.
func mapHostDirs(p *policy.Policy, hostUID, hostGID, creator int, stage func() (string, error)) (*hostDirs, error) {
	h := &hostDirs{}
	ids := struct{ hostUID, hostGID int }{hostUID, hostGID}
	userns := map[[2]uint32]int{} // one user namespace per host owner
	defer func() {
		for _, fd := range userns {
			unix.Close(fd)
		}
	}()
	attach := func(src, dst string) (string, error) {
		fi, err := os.Stat(src)
		if err != nil {
			return "", fmt.Errorf("mount %s: %w", src, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || int(st.Uid) == ids.hostUID {
			return "", nil // the sandbox user's own: a plain bind
		}
		if st.Uid == 0 || st.Gid == 0 {
			if fi.Mode().Perm()&0o002 != 0 && st.Uid == 0 {
				return "", nil // world-writable (a /tmp-like directory): the sandbox writes as its own host ids
			}
			return "", fmt.Errorf("mount %s at %s read-write: the sandbox user cannot write %s, owned by uid %d, gid %d (root), and airlock does not ID-map "+
				"a root-owned directory (the sandbox's files there would belong to host root): chown it to an unprivileged user (chown -R USER:GROUP %s; "+
				"airlock then maps that owner to the sandbox user), make it writable for the sandbox (chmod -R o+rwX %s), or mount it read-only (drop :rw)",
				src, dst, src, st.Uid, st.Gid, src, src)
		}
		owner := [2]uint32{st.Uid, st.Gid}
		ns, ok := userns[owner]
		if !ok {
			uids := []syscall.SysProcIDMap{{ContainerID: int(st.Uid), HostID: ids.hostUID, Size: 1}}
			gids := []syscall.SysProcIDMap{{ContainerID: int(st.Gid), HostID: ids.hostGID, Size: 1}}
			if creator >= 0 && creator != ids.hostUID {
				uids = append(uids, syscall.SysProcIDMap{ContainerID: nobodyID, HostID: creator, Size: 1})
			}
			if creator >= 0 && creator != ids.hostGID {
				gids = append(gids, syscall.SysProcIDMap{ContainerID: nobodyID, HostID: creator, Size: 1})
			}
			if ns, err = idmapUserns(uids, gids); err != nil {
				return "", err
			}
			userns[owner] = ns
		}
		if h.stage == "" {
			if h.stage, err = stage(); err != nil {
				return "", err
			}
		}
		at := filepath.Join(h.stage, strconv.Itoa(len(h.attached)))
		if fi.IsDir() {
			err = os.MkdirAll(at, 0o700)
		} else if err = os.MkdirAll(h.stage, 0o700); err == nil {
			err = os.WriteFile(at, nil, 0o600)
		}
		if err != nil {
			return "", fmt.Errorf("stage %s: %w", src, err)
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return "", fmt.Errorf("mount %s: open_tree: %w", src, err)
		}
		defer unix.Close(fd)
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Userns_fd: uint64(ns)}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return "", fmt.Errorf("mount %s: ID-mapped mount (the filesystem must support ID-mapped mounts): %w", src, err)
		}
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, at, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return "", fmt.Errorf("mount %s: attach ID-mapped mount: %w", src, err)
		}
		h.attached = append(h.attached, at)
		h.desc = append(h.desc, fmt.Sprintf("%s (host uid %d, gid %d) at %s", src, st.Uid, st.Gid, dst))
		return at, nil
	}
	fs := &p.Filesystem
	if fs.Workspace != "" {
		src, err := filepath.EvalSymlinks(fs.Workspace)
		if err != nil {
			return nil, fmt.Errorf("workspace %s: %w", fs.Workspace, err)
		}
		at, err := attach(src, "/workspace")
		if err != nil {
			h.undo()
			return nil, err
		}
		if at != "" {
			fs.Workspace = at
		}
	}
	mounts := append([]policy.Mount(nil), fs.Mounts...) // never write the caller's array
	for i, m := range mounts {
		if !m.Writable {
			continue
		}
		src, err := filepath.EvalSymlinks(m.Source)
		if err != nil {
			h.undo()
			return nil, fmt.Errorf("mount source %s: %w", m.Source, err)
		}
		at, err := attach(src, m.Target)
		if err != nil {
			h.undo()
			return nil, err
		}
		if at != "" {
			mounts[i].Source = at
		}
	}
	fs.Mounts = mounts
	return h, nil
}

// nobodyID is the host's nobody, uid and gid.
const nobodyID = 65534

// describe is the enforced layer's detail.
func (h *hostDirs) describe() string {
	return "ID-mapped onto the sandbox user (nosuid, nodev; seccomp refuses set-uid/set-gid modes): " + strings.Join(h.desc, "; ")
}
