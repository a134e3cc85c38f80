package native

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
)

// Layout is the sandbox root that the native runtime builds for a policy,
// described for another runtime (gVisor's runsc) to build the same tree:
// the root template directory and the mounts on top of it, in order.
type Layout struct {
	// Root is the template directory (skeleton, synthesized /etc files,
	// mount points); it is mounted read-only as the sandbox's /.
	Root string
	// Mounts are applied in order on top of Root.
	Mounts []LayoutMount
	// HomeBind, when set, is a directory of Root (/home/<user>) that must
	// become a second mount of /workspace after Mounts, which an OCI
	// runtime's own mounts cannot make (they bind host paths, not one of
	// the sandbox's mounts): the gvisor runtime's agent binds it. Empty
	// when /home/<user> is a symbolic link to /workspace.
	HomeBind string
}

// LayoutMount is one mount of a Layout.
type LayoutMount struct {
	// Target is the path inside the sandbox.
	Target string
	// Type is "bind" for a host path, else a filesystem type: "tmpfs",
	// "proc" or "devpts".
	Type string
	// Source is the host path of a bind.
	Source string
	// Options are mount(8)-style: "rbind", "ro", "nosuid", "nodev",
	// "noexec", and a filesystem's own "size=...", "mode=...".
	Options []string
}

// RootLayout returns the root tree the native runtime would build for p
// (and an agent binary bound at AgentPath when agentBinary is set). It
// shares the template cache with native sandboxes. With homeBind,
// /home/<user> is a directory that the caller binds the workspace onto
// (Layout.HomeBind); without, a symbolic link to /workspace.
func RootLayout(p *policy.Policy, agentBinary string, homeBind bool) (*Layout, error) {
	base, err := stagingDir()
	if err != nil {
		return nil, err
	}
	t, err := cachedTree(base, p, &Config{AgentBinary: agentBinary}, !homeBind)
	if err != nil {
		return nil, &SetupError{Step: "root filesystem", Err: err}
	}
	return t.layout()
}

// flagOptions are the per-mount flags a Layout carries as options.
var flagOptions = []struct {
	flag uintptr
	opt  string
}{{unix.MS_RDONLY, "ro"}, {unix.MS_NOSUID, "nosuid"}, {unix.MS_NODEV, "nodev"}, {unix.MS_NOEXEC, "noexec"}}

// layout converts the mount steps of t (after the root bind) to a Layout.
func (t *treeBuilder) layout() (*Layout, error) {
	l := &Layout{Root: t.root, HomeBind: t.homeBind}
	ops := t.ops[len(t.ops)-len(t.opPaths):] // the steps before are the root's own bind
	for i, o := range ops {
		at := t.opPaths[i]
		var opts []string
		for _, f := range flagOptions {
			if o.flags&f.flag != 0 {
				opts = append(opts, f.opt)
			}
		}
		switch {
		case o.flags&unix.MS_REMOUNT != 0:
			if len(l.Mounts) == 0 || l.Mounts[len(l.Mounts)-1].Target != at {
				return nil, fmt.Errorf("root layout: remount of %s without a mount before it", at)
			}
			m := &l.Mounts[len(l.Mounts)-1]
			m.Options = append(m.Options, opts...)
		case o.flags&unix.MS_BIND != 0:
			bind := "bind"
			if o.flags&unix.MS_REC != 0 {
				bind = "rbind"
			}
			l.Mounts = append(l.Mounts, LayoutMount{Target: at, Type: "bind", Source: goString(o.src), Options: append([]string{bind}, opts...)})
		case o.fstype == nil:
			continue // not a mount (the child creating a mount point): OCI runtimes make their own
		default:
			if data := goString(o.data); data != "" {
				opts = append(opts, strings.Split(data, ",")...)
			}
			l.Mounts = append(l.Mounts, LayoutMount{Target: at, Type: goString(o.fstype), Source: goString(o.src), Options: opts})
		}
	}
	// After pivot_root the child moves binds staged in the template into
	// the tmpfs /workspace and /tmp (bindUnderTmpfs): in a Layout they go
	// straight to their target, after the tmpfs they live in.
	for _, o := range t.remount {
		if o.flags&unix.MS_MOVE == 0 {
			continue
		}
		from, to := goString(o.src), goString(o.path)
		i := slices.IndexFunc(l.Mounts, func(m LayoutMount) bool { return m.Target == from })
		if i < 0 {
			return nil, fmt.Errorf("root layout: move of %s, which is not mounted", from)
		}
		m := l.Mounts[i]
		m.Target = to
		l.Mounts = append(slices.Delete(l.Mounts, i, i+1), m)
	}
	return l, nil
}

// goString converts a NUL-terminated string made by cstr back (nil is "").
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	return unix.BytePtrToString(p)
}
