package microvm

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

// VirtiofsdBinary is the virtio-fs daemon that serves volumes to guests:
// QEMU 7.2's, which Debian 12 ships in qemu-system-common.
var VirtiofsdBinary = "/usr/lib/qemu/virtiofsd"

// volumeShare is one volume served to a guest: QEMU's end of the
// vhost-user connection and the daemon, in the sandbox's volume daemons'
// cgroup (group, shared by its volumes; nil when cgroups are missing and
// the policy allows that).
type volumeShare struct {
	qemu   *os.File
	daemon *exec.Cmd
	tag    string
	target string
	group  *cgroups.Group
}

// Limits of a sandbox's volume daemons' cgroup, per volume: memory
// (virtiofsd's own, and the host page cache of the files it serves,
// reclaimed at the limit) and tasks (virtiofsd's threads: its thread pool,
// a queue thread, its sandbox's process).
const (
	volumeDaemonMemory = 128 << 20
	volumeDaemonTasks  = 32
)

// volumeGroup names the cgroup of sandbox id's volume daemons: a group of
// their own beside QEMU's (airlock/ID), not inside it.
func volumeGroup(id string) string { return id + "-vfs" }

// volumeGroupFor creates sandbox id's volume daemons' cgroup for n volumes
// (cpus: the sandbox's CPU quota, 0 for none). With allowDegraded, a host
// without the cgroups it needs gets nil and the reason.
func volumeGroupFor(id string, n int, cpus float64, allowDegraded bool) (*cgroups.Group, error) {
	g, err := cgroups.Create(volumeGroup(id), cgroups.Limits{MemoryBytes: int64(n) * volumeDaemonMemory,
		Pids: int64(n) * volumeDaemonTasks, CPUs: cpus})
	if err != nil && allowDegraded {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("microvm: the volume daemons' cgroup: %w", err)
	}
	return g, nil
}

// shareVolumes starts a virtiofsd per volume, each serving its host
// directory (sandbox=namespace: the daemon pivots into the directory in
// mount, pid and network namespaces of its own, under its seccomp
// filter) over a vhost-user connection whose other end is for QEMU. The
// connection is made here, through a listening socket in a private
// directory that is removed at once, so QEMU needs no path. Volume
// targets go on the kernel command line and must be plain absolute paths.
// The daemons run in a cgroup of their own (volumeGroup), which they join
// before they start, and which goes with them (stopVolumes).
func shareVolumes(vols []native.VolumeMount, id string, cpus float64, allowDegraded, surviveParent bool) ([]*volumeShare, error) {
	if len(vols) == 0 {
		return nil, nil
	}
	if _, err := os.Stat(VirtiofsdBinary); err != nil {
		return nil, fmt.Errorf("microvm: volumes need virtiofsd (qemu-system-common): %w", err)
	}
	group, err := volumeGroupFor(id, len(vols), cpus, allowDegraded)
	if err != nil {
		return nil, err
	}
	var out []*volumeShare
	fail := func(err error) ([]*volumeShare, error) {
		stopVolumes(out)
		destroyGroup(group)
		return nil, err
	}
	for i, v := range vols {
		t := filepath.Clean(v.Target)
		if !filepath.IsAbs(v.Target) || t == "/" || strings.ContainsAny(t, " \t\n,:\"'\\") || t == "/.airlock" || strings.HasPrefix(t, "/.airlock/") {
			return fail(fmt.Errorf("microvm: volume target %q: want a plain absolute path", v.Target))
		}
		if fi, err := os.Stat(v.Dir); err != nil || !fi.IsDir() {
			return fail(fmt.Errorf("microvm: volume %s: not a directory (%v)", v.Dir, err))
		}
		dir, err := os.MkdirTemp("", "airlock-vfs-")
		if err != nil {
			return fail(fmt.Errorf("microvm: volume: %w", err))
		}
		sock := filepath.Join(dir, "s")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			os.RemoveAll(dir)
			return fail(fmt.Errorf("microvm: volume: %w", err))
		}
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
		os.RemoveAll(dir) // both ends exist: the path is not needed
		if err != nil {
			ln.Close()
			return fail(fmt.Errorf("microvm: volume: %w", err))
		}
		lf, err := ln.File()
		ln.Close()
		if err != nil {
			c.Close()
			return fail(fmt.Errorf("microvm: volume: %w", err))
		}
		cf, err := c.File()
		c.Close()
		if err != nil {
			lf.Close()
			return fail(fmt.Errorf("microvm: volume: %w", err))
		}
		// Started by the jail's helper without a jail: it joins the
		// daemons' cgroup before it execs virtiofsd (which forks its
		// sandbox at once), as root (virtiofsd's sandbox needs it).
		cmd, err := newJailed(VirtiofsdBinary, []string{"--fd=3", "-o", "source=" + v.Dir, "-o", "sandbox=namespace",
			"-o", "cache=auto", "-o", "no_posix_lock", "--thread-pool-size=4"}, []*os.File{lf}, jailSpec{Pdeathsig: !surviveParent}, group)
		if err == nil {
			err = cmd.start()
		}
		lf.Close()
		if err != nil {
			cf.Close()
			return fail(fmt.Errorf("microvm: volume: start virtiofsd: %w", err))
		}
		out = append(out, &volumeShare{qemu: cf, daemon: cmd.Cmd, tag: fmt.Sprintf("vol%d", i), target: t, group: group})
	}
	return out, nil
}

// stopVolumes kills the daemons, closes QEMU's ends and removes the
// daemons' cgroup.
func stopVolumes(vs []*volumeShare) {
	for _, v := range vs {
		v.qemu.Close()
		if v.daemon.Process != nil {
			v.daemon.Process.Kill()
			v.daemon.Wait()
		}
	}
	if len(vs) > 0 {
		destroyGroup(vs[0].group)
	}
}

// volumeGroupDetail describes the volume daemons' cgroup for enforced.
func volumeGroupDetail(vs []*volumeShare) string {
	switch {
	case len(vs) == 0:
		return ""
	case vs[0].group == nil:
		return "; the volume daemons' resources NOT limited (no cgroup)"
	}
	return fmt.Sprintf("; the volume daemons in a cgroup of their own, not QEMU's (memory %d MiB, %d tasks)", len(vs)*volumeDaemonMemory>>20, len(vs)*volumeDaemonTasks)
}

// destroyGroup kills what is left in g (a daemon's sandbox process) and
// removes it.
func destroyGroup(g *cgroups.Group) {
	if g != nil {
		g.Kill()
		g.Destroy()
	}
}
