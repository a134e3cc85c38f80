package native

import (
	"errors"

	"github.com/airlock-dev/airlock/policy"
)

// MountedImage is an image root that ImageLayout mounted on the host for a
// runtime that serves it itself.
type MountedImage struct {
	ov *overlayRoot
	// Merged is the overlay's mount point (the layout's Root).
	Merged string
	// DiskWorkspace: /workspace is a directory of the root, on the capped
	// upper disk (the layout has no tmpfs there).
	DiskWorkspace bool
	// Quota describes the upper disk's cap ("N bytes, M inodes").
	Quota string
	// Dirs are the root's top-level directories the sandbox may write.
	Dirs []string
}

// Started is called once the runtime has the root (its file server opened
// it): the overlay's own mount fd is closed and a ready disk taken from the
// pool is replaced. The overlay stays mounted at Merged until Unmount.
func (m *MountedImage) Started() {
	if m == nil || m.ov == nil {
		return
	}
	m.ov.release()
}

// Abort undoes a root whose sandbox did not start: the overlay and the
// upper disk are unmounted (ImageRoot.Dir stays, the caller's).
func (m *MountedImage) Abort() {
	if m == nil || m.ov == nil {
		return
	}
	m.ov.abort()
}

// Unmount detaches the overlay from the host once the sandbox is gone; the
// upper disk stays mounted (ImageRoot.UpperDir) until RemoveImageRoot.
func (m *MountedImage) Unmount() {
	if m == nil || m.ov == nil {
		return
	}
	m.ov.detach()
}

// ImageLayout is RootLayout for an image root, for a runtime whose file
// server shows the sandbox host files with their host ids as they are
// (gVisor's gofer, which runs in the host's user namespace): the overlay
// of img is mounted on the host at img.Dir/merged (writable; nosuid,
// nodev), its lower layers not ID-mapped, so that a file the image owns as
// uid N is seen as uid N, and the sandbox's writes land in img's upper
// directory with the sandbox's own ids (0-65535, as layers store them:
// commit them with id base 0). The layout's mounts are those of the
// policy without its host-derived parts, as for a native image sandbox.
// p is not changed. The caller calls Started once the runtime has the
// root, Unmount once it is gone, or Abort if it never started.
func ImageLayout(p *policy.Policy, agentBinary string, img *ImageRoot, homeBind bool) (*Layout, *MountedImage, error) {
	if img == nil {
		return nil, nil, errors.New("image layout without an image root")
	}
	q := *p
	imagePolicy(&q)
	base, err := stagingDir()
	if err != nil {
		return nil, nil, err
	}
	t, err := cachedTree(base, &q, &Config{AgentBinary: agentBinary}, !homeBind)
	if err != nil {
		return nil, nil, &SetupError{Step: "root filesystem", Err: err}
	}
	n, ov, err := mountImageTree(t, img, 0, false, &q)
	if err != nil {
		return nil, nil, &SetupError{Step: "image root", Err: err}
	}
	l, err := n.layout()
	if err != nil {
		ov.abort()
		return nil, nil, &SetupError{Step: "image root", Err: err}
	}
	return l, &MountedImage{ov: ov, Merged: ov.merged, DiskWorkspace: ov.workspace, Quota: ov.quota, Dirs: ov.dirs}, nil
}
