package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// topLevel lists the root directories that hold programs and libraries. On
// a merged-/usr system (Debian 12) they are symlinks into /usr; otherwise
// they are directories that must be bound read-only.
var topLevel = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// rootEntry is how one of topLevel exists on the host.
type rootEntry struct {
	name   string // e.g. "lib64"
	link   string // symlink target if it is a symlink, e.g. "usr/lib64"
	isDir  bool   // true if it is a real directory
	exists bool
}

// hostRoot inspects topLevel on the host.
func hostRoot() []rootEntry {
	var out []rootEntry
	for _, n := range topLevel {
		e := rootEntry{name: n}
		fi, err := os.Lstat("/" + n)
		if err == nil {
			e.exists = true
			switch {
			case fi.Mode()&os.ModeSymlink != 0:
				e.link, _ = os.Readlink("/" + n)
			case fi.IsDir():
				e.isDir = true
			default:
				e.exists = false
			}
		}
		if e.exists {
			out = append(out, e)
		}
	}
	return out
}

// bwrapArgs returns the bwrap arguments for a read-only /usr root with all
// namespaces unshared, followed by argv.
func bwrapArgs(argv []string) []string {
	args := []string{"--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"}
	for _, e := range hostRoot() {
		if e.link != "" {
			args = append(args, "--symlink", e.link, "/"+e.name)
		} else {
			args = append(args, "--ro-bind", "/"+e.name, "/"+e.name)
		}
	}
	args = append(args, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--")
	return append(args, argv...)
}

// OCI runtime-spec subset used by the bundles (runtime-spec 1.0).
type ociSpec struct {
	OCIVersion string     `json:"ociVersion"`
	Process    ociProcess `json:"process"`
	Root       ociRoot    `json:"root"`
	Hostname   string     `json:"hostname"`
	Mounts     []ociMount `json:"mounts"`
	Linux      ociLinux   `json:"linux"`
}

type ociProcess struct {
	Terminal        bool            `json:"terminal"`
	User            ociUser         `json:"user"`
	Args            []string        `json:"args"`
	Env             []string        `json:"env"`
	Cwd             string          `json:"cwd"`
	NoNewPrivileges bool            `json:"noNewPrivileges"`
	Capabilities    ociCapabilities `json:"capabilities"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCapabilities struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Permitted   []string `json:"permitted"`
	Inheritable []string `json:"inheritable"`
	Ambient     []string `json:"ambient"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type,omitempty"`
	Source      string   `json:"source,omitempty"`
	Options     []string `json:"options,omitempty"`
}

type ociIDMap struct {
	ContainerID uint32 `json:"containerID"`
	HostID      uint32 `json:"hostID"`
	Size        uint32 `json:"size"`
}

type ociNamespace struct {
	Type string `json:"type"`
}

type ociLinux struct {
	CgroupsPath string         `json:"cgroupsPath,omitempty"`
	Namespaces  []ociNamespace `json:"namespaces"`
	UIDMappings []ociIDMap     `json:"uidMappings,omitempty"`
	GIDMappings []ociIDMap     `json:"gidMappings,omitempty"`
}

// bundle is an OCI bundle directory whose config.json is rewritten when the
// command changes. Its root is an empty read-only directory with /usr (and
// any real top-level library directories) bound read-only, the merged-/usr
// symlinks, proc, a tmpfs /dev and a tmpfs /tmp; namespaces pid, mount, ipc,
// uts, network (no interfaces but lo) and cgroup, plus user when not root.
type bundle struct {
	dir      string
	rootless bool
	last     []string
	lastCg   string
}

// newBundle creates a bundle under parent.
func newBundle(parent string, rootless bool) (*bundle, error) {
	dir, err := os.MkdirTemp(parent, "bundle-")
	if err != nil {
		return nil, err
	}
	b := &bundle{dir: dir, rootless: rootless}
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"usr", "proc", "dev", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return nil, err
		}
	}
	for _, e := range hostRoot() {
		p := filepath.Join(rootfs, e.name)
		if e.link != "" {
			err = os.Symlink(e.link, p)
		} else {
			err = os.Mkdir(p, 0o755)
		}
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// stateDir returns a per-runtime state directory inside the bundle.
func (b *bundle) stateDir(runtime string) string {
	return filepath.Join(b.dir, "state-"+runtime)
}

// setArgs writes config.json for argv unless it already holds argv. The
// runtime chooses the container's cgroup.
func (b *bundle) setArgs(argv []string) error { return b.setSpec(argv, "") }

// setSpec writes config.json for argv and the cgroup path (empty: the
// runtime's default) unless it already holds them.
func (b *bundle) setSpec(argv []string, cgroupsPath string) error {
	if b.last != nil && slices.Equal(b.last, argv) && b.lastCg == cgroupsPath {
		return nil
	}
	spec := b.spec(argv)
	spec.Linux.CgroupsPath = cgroupsPath
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(b.dir, "config.json"), data, 0o644); err != nil {
		return err
	}
	b.last, b.lastCg = slices.Clone(argv), cgroupsPath
	return nil
}

// containerBundle writes a bundle of container id's own, dir/c-ID, whose
// config.json runs argv in cgroupsPath (empty: the runtime's default) on
// b's shared rootfs, so that containers started at once never read a spec
// another start is rewriting (the concurrent-create figure starts 50).
// The caller removes the directory once the container is deleted.
func (b *bundle) containerBundle(id string, argv []string, cgroupsPath string) (string, error) {
	dir := filepath.Join(b.dir, "c-"+id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	spec := b.spec(argv)
	spec.Linux.CgroupsPath = cgroupsPath
	spec.Root.Path = filepath.Join(b.dir, "rootfs")
	data, err := json.MarshalIndent(spec, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644)
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// spec returns the runtime spec for argv.
func (b *bundle) spec(argv []string) ociSpec {
	ro := []string{"rbind", "ro", "nosuid", "nodev"}
	mounts := []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
		{Destination: "/usr", Type: "bind", Source: "/usr", Options: ro},
	}
	for _, e := range hostRoot() {
		if e.isDir {
			mounts = append(mounts, ociMount{Destination: "/" + e.name, Type: "bind", Source: "/" + e.name, Options: ro})
		}
	}
	ns := []ociNamespace{{"pid"}, {"mount"}, {"ipc"}, {"uts"}, {"network"}, {"cgroup"}}
	s := ociSpec{
		OCIVersion: "1.0.2",
		Process: ociProcess{
			Args:            slices.Clone(argv),
			Env:             []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp"},
			Cwd:             "/",
			NoNewPrivileges: true,
			Capabilities: ociCapabilities{
				Bounding: []string{}, Effective: []string{}, Permitted: []string{},
				Inheritable: []string{}, Ambient: []string{},
			},
		},
		Root:     ociRoot{Path: "rootfs", Readonly: true},
		Hostname: "bench",
		Mounts:   mounts,
		Linux:    ociLinux{Namespaces: ns},
	}
	if b.rootless {
		s.Linux.Namespaces = append(s.Linux.Namespaces, ociNamespace{"user"})
		s.Linux.UIDMappings = []ociIDMap{{ContainerID: 0, HostID: uint32(os.Geteuid()), Size: 1}}
		s.Linux.GIDMappings = []ociIDMap{{ContainerID: 0, HostID: uint32(os.Getegid()), Size: 1}}
	}
	return s
}

// remove detaches any mounts a runtime left in the bundle directory and
// deletes it.
func (b *bundle) remove() {
	if b != nil && b.dir != "" {
		unmountUnder(b.dir)
		os.RemoveAll(b.dir)
	}
}

// removeCgroups removes the (empty) cgroups named prefix-PID-* that a
// runtime left in the cgroup v1 or v2 hierarchies, e.g. after a failed run.
func removeCgroups(prefix string) {
	pat := fmt.Sprintf("%s-%d-*", prefix, os.Getpid())
	for _, g := range []string{"/sys/fs/cgroup/*/" + pat, "/sys/fs/cgroup/" + pat} {
		dirs, _ := filepath.Glob(g)
		for _, d := range dirs {
			os.Remove(d)
		}
	}
}

// containerID returns a fresh container name. The counter is zero-padded
// so that no id is a prefix of another: runsc resolves ids by prefix and
// refuses "x-1" while "x-10" exists.
func containerID(prefix string, n int) string {
	return fmt.Sprintf("%s-%d-%06d", prefix, os.Getpid(), n)
}
