package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
)

// rootLayout returns the tree the sandbox's root is built from: the
// host-derived template (native.RootLayout), or, with cfg.Image, the
// overlay of the image's layers and a per-sandbox upper directory on a
// capped disk, mounted on the host (native.ImageLayout) and served
// read-write by the gofer. gVisor's gofer runs in the host's user
// namespace, so files keep their on-disk ids: the layers' and volumes'
// 0-65535 are the sandbox's own uids and gids, as a native sandbox sees
// them through its ID-mapped mounts, and what the sandbox writes carries
// its own ids on the host (commit an upper directory with id base 0:
// tier.Caps.UnmappedIDs). Volumes are bound read-write (nosuid, nodev) at
// their targets. The returned image, if any, is the caller's to start
// (Started), to unmount (Unmount) or to abort.
func rootLayout(p *policy.Policy, cfg *native.Config, homeBind bool) (*native.Layout, *native.MountedImage, error) {
	q := *p
	if len(cfg.Volumes) > 0 {
		n := len(q.Filesystem.Mounts) // never append into the caller's array
		q.Filesystem.Mounts = q.Filesystem.Mounts[:n:n]
		for _, v := range cfg.Volumes {
			if v.Dir == "" || !strings.HasPrefix(v.Target, "/") {
				return nil, nil, &native.SetupError{Step: "volumes", Err: fmt.Errorf("volume %q at %q: want a host directory and an absolute target", v.Dir, v.Target)}
			}
			q.Filesystem.Mounts = append(q.Filesystem.Mounts, policy.Mount{Source: v.Dir, Target: v.Target, Writable: true})
		}
	}
	if cfg.Image == nil {
		l, err := native.RootLayout(&q, cfg.AgentBinary, homeBind)
		return l, nil, err
	}
	return native.ImageLayout(&q, cfg.AgentBinary, cfg.Image, homeBind)
}

// imageSpec makes the spec's root the image overlay, writable.
func imageSpec(spec *specs.Spec, img *native.MountedImage) {
	if img == nil {
		return
	}
	spec.Root = &specs.Root{Path: img.Merged, Readonly: false}
}

// imageEnforced rewrites the filesystem layers for an image root and
// volumes.
func imageEnforced(e rt.Enforced, img *native.MountedImage, cfg *native.Config) rt.Enforced {
	for i := range e {
		switch {
		case img != nil && e[i].Name == "filesystem":
			e[i].Detail = "replaces Landlock: files are served by gVisor's gofer; the image root is writable (its changes land in the per-sandbox upper directory), host binds read-only"
		case img != nil && img.DiskWorkspace && e[i].Name == "tmpfs":
			e[i].Detail = strings.Replace(e[i].Detail, "/tmp and /workspace", "/tmp", 1) + "; /workspace is on the image root's capped disk"
		}
	}
	if img != nil {
		ws := ""
		if img.DiskWorkspace {
			ws = ", /workspace on it"
		}
		e = append(e, rt.Layer{Name: "rootfs", State: rt.StateOK,
			Detail: fmt.Sprintf("image: overlayfs of %d read-only layers and a per-sandbox upper directory on disk (ext4 on a loop device, capped at %s%s; nosuid, nodev), mounted on the host and served by gVisor's gofer with the image's own uids and gids; writable under %s",
				len(cfg.Image.Layers), img.Quota, ws, strings.Join(img.Dirs, " "))})
	}
	if len(cfg.Volumes) > 0 {
		var at []string
		for _, v := range cfg.Volumes {
			at = append(at, v.Target)
		}
		e = append(e, rt.Layer{Name: "volumes", State: rt.StateOK,
			Detail: "read-write through gVisor's gofer (nosuid, nodev), with the volume's own uids and gids, as native sandboxes see them: " + strings.Join(at, " ")})
	}
	return e
}

// rootAgentArgs are the agent's arguments for a uid-0 workload (an image
// whose user is root, or "user": "root"): the agent, which starts as root
// to mount its tmpfs (privileged), then takes real and saved uid
// native.AgentUID, out of the workload's reach (the agent's
// becomeRootAgent). An agent that would share uid 0 with the workload
// unprivileged is refused.
func rootAgentArgs(p *policy.Policy, cfg *native.Config, privileged bool) ([]string, error) {
	if !cfg.Agent || p.User.UID != 0 || p.User.GID != 0 {
		return nil, nil
	}
	if !privileged {
		return nil, &native.SetupError{Step: "agent", Err: errors.New("a uid-0 workload needs the agent to start privileged (to take an identity of its own), and this layout gives it nothing to mount")}
	}
	return []string{fmt.Sprintf("--root-agent-id=%d", native.AgentUID)}, nil
}

// rootAgentSpec gives the privileged agent of a uid-0 workload what
// becomeRootAgent keeps: kill, and the root workload's capabilities
// (native.RootCaps, with "user": "root") to hand on as ambient ones.
func rootAgentSpec(spec *specs.Spec, p *policy.Policy, cfg *native.Config, privileged bool) {
	if !cfg.Agent && p.User.Root && p.User.UID == 0 && spec.Process.Capabilities != nil {
		// A one-shot run (a template's RUN step) of "user": "root": no
		// agent to keep out of reach, the program itself gets the root
		// workload's capabilities (inside the sentry), ambient so that
		// what it execs keeps them, as native's root does.
		var names []string
		for _, c := range native.RootCaps {
			names = append(names, capName(c))
		}
		c := spec.Process.Capabilities
		c.Bounding, c.Effective, c.Permitted, c.Inheritable, c.Ambient = names, names, names, names, names
		return
	}
	if !privileged || !cfg.Agent || p.User.UID != 0 || p.User.GID != 0 || spec.Process.Capabilities == nil {
		return
	}
	add := []string{"CAP_KILL"}
	if p.User.Root {
		for _, c := range native.RootCaps {
			add = append(add, capName(c))
		}
	}
	c := spec.Process.Capabilities
	for _, n := range add {
		if !slices.Contains(c.Bounding, n) {
			c.Bounding = append(c.Bounding, n)
			c.Effective = append(c.Effective, n)
			c.Permitted = append(c.Permitted, n)
		}
	}
}

// capName is the OCI name of capability c.
func capName(c int) string {
	names := map[int]string{unix.CAP_CHOWN: "CAP_CHOWN", unix.CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE", unix.CAP_DAC_READ_SEARCH: "CAP_DAC_READ_SEARCH",
		unix.CAP_FOWNER: "CAP_FOWNER", unix.CAP_SETGID: "CAP_SETGID", unix.CAP_SETUID: "CAP_SETUID", unix.CAP_NET_BIND_SERVICE: "CAP_NET_BIND_SERVICE", unix.CAP_KILL: "CAP_KILL"}
	if n, ok := names[c]; ok {
		return n
	}
	return fmt.Sprintf("CAP_%d", c) // refused by runsc: fails closed
}

// upperFile names, in a sandbox's state directory, the file that records
// its image root's upper directory, for a server that adopts it after a
// restart (a memory snapshot copies that directory).
const upperFile = "upper"

// saveUpper records the sandbox's upper directory in its state directory.
func (s *Sandbox) saveUpper() error {
	if s.upper == "" {
		return nil
	}
	if err := os.WriteFile(filepath.Join(s.dir, upperFile), []byte(s.upper), 0o600); err != nil {
		return fmt.Errorf("gvisor: record the image root: %w", err)
	}
	return nil
}

// readUpper returns the upper directory recorded in state directory dir,
// "" for a sandbox without an image root.
func readUpper(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, upperFile))
	if err != nil {
		return ""
	}
	return string(b)
}
