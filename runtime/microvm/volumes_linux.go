package microvm

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/airlock-dev/airlock/runtime/launcher"
	"github.com/airlock-dev/airlock/runtime/native"
)

// VirtiofsdBinary is the virtio-fs daemon that serves volumes to guests:
// QEMU 7.2's, which Debian 12 ships in qemu-system-common.
var VirtiofsdBinary = "/usr/lib/qemu/virtiofsd"

// volumeShare is one volume served to a guest: QEMU's end of the
// vhost-user connection and the daemon.
type volumeShare struct {
	qemu   *os.File
	daemon *exec.Cmd
	tag    string
	target string
}

// shareVolumes starts a virtiofsd per volume, each serving its host
// directory (sandbox=namespace: the daemon pivots into the directory in
// mount, pid and network namespaces of its own, under its seccomp
// filter) over a vhost-user connection whose other end is for QEMU. The
// connection is made here, through a listening socket in a private
// directory that is removed at once, so QEMU needs no path. Volume
// targets go on the kernel command line and must be plain absolute paths.
func shareVolumes(vols []native.VolumeMount, surviveParent bool) ([]*volumeShare, error) {
	var out []*volumeShare
	fail := func(err error) ([]*volumeShare, error) {
		stopVolumes(out)
		return nil, err
	}
	if len(vols) == 0 {
		return nil, nil
	}
	if _, err := os.Stat(VirtiofsdBinary); err != nil {
		return nil, fmt.Errorf("microvm: volumes need virtiofsd (qemu-system-common): %w", err)
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
		cmd := exec.Command(VirtiofsdBinary, "--fd=3", "-o", "source="+v.Dir, "-o", "sandbox=namespace",
			"-o", "cache=auto", "-o", "no_posix_lock", "--thread-pool-size=4")
		cmd.ExtraFiles = []*os.File{lf}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		start := cmd.Start
		if !surviveParent {
			cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
			start = func() error { return launcher.Run(cmd.Start) }
		}
		err = start()
		lf.Close()
		if err != nil {
			cf.Close()
			return fail(fmt.Errorf("microvm: volume: start virtiofsd: %w", err))
		}
		out = append(out, &volumeShare{qemu: cf, daemon: cmd, tag: fmt.Sprintf("vol%d", i), target: t})
	}
	return out, nil
}

// stopVolumes kills the daemons and closes QEMU's ends.
func stopVolumes(vs []*volumeShare) {
	for _, v := range vs {
		v.qemu.Close()
		if v.daemon.Process != nil {
			v.daemon.Process.Kill()
			v.daemon.Wait()
		}
	}
}
