package microvm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// Adopt implements tier.Adopter for a sandbox that a previous server paused
// to disk and did not resume: no QEMU of it runs, and its saved state,
// disks, cgroup and recorded launch (launchFile, in its state directory)
// are all a new QEMU needs. It comes back suspended, with an agent
// connection (Conn) whose stream goes on once Resume has started that QEMU.
//
// A running microvm sandbox is not taken over (adopt_running is not
// declared): its QEMU ends with the server that started it. Nor is a paused
// one with volumes (frozen, not saved: its QEMU ended too) or with network
// (its egress port carried a session of the previous server's mux, which a
// new one cannot continue).
func (Tier) Adopt(info tier.AdoptInfo) (tier.Instance, error) {
	if !info.Paused {
		return nil, errors.New("microvm: a running guest's QEMU ends with the server that started it (adopt_running is not declared)")
	}
	if !validID(info.ID) {
		return nil, fmt.Errorf("microvm: bad sandbox id %q", info.ID)
	}
	dir := filepath.Join(StateDir, info.ID)
	l, err := loadLaunch(dir)
	if err != nil {
		return nil, err
	}
	switch {
	case l.volumes:
		return nil, errors.New("microvm: a sandbox with volumes paused by freezing its QEMU, which ended with the previous server")
	case l.egress:
		return nil, errors.New("microvm: a paused sandbox with network is not taken over (its egress session was the previous server's)")
	}
	group, err := cgroups.Lookup(info.ID)
	if err != nil {
		return nil, fmt.Errorf("microvm: the paused sandbox's cgroup: %w", err)
	}
	l.group = group
	l.surviveParent = false
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("microvm: socketpair: %w", err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "agent")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			if i == 0 {
				unix.Close(fds[1])
			}
			return nil, fmt.Errorf("microvm: agent connection: %w", err)
		}
	}
	gone := &qemuProc{pid: info.Pid, done: make(chan struct{})}
	close(gone.done)
	vm := &VM{id: info.ID, dir: dir, launch: l, group: group, enforced: info.Enforced, cur: gone, suspended: true,
		conn: conns[0], agent: newPortRelay(conns[1]), ended: make(chan struct{})}
	return vm, nil
}
