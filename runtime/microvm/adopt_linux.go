package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// AdoptWait bounds the takeover of a running VM: reaching its monitor and
// starting new sessions on its ports.
var AdoptWait = time.Minute

// Adopt implements tier.Adopter. A running sandbox (adopt_running) is taken
// over with its QEMU, which outlived the server that started it
// (adoptRunning). A sandbox that a previous server paused to disk and did
// not resume has no QEMU: its saved state, disks, cgroup and recorded
// launch (launchFile, in its state directory) are all a new QEMU needs. It
// comes back suspended, with an agent connection (Conn) whose stream goes
// on once Resume has started that QEMU. A paused one with volumes (frozen,
// not saved) or with network (its egress port carried a session of the
// previous server's mux, which a saved guest continues) is not taken over.
func (Tier) Adopt(info tier.AdoptInfo) (tier.Instance, error) {
	if !validID(info.ID) {
		return nil, fmt.Errorf("microvm: bad sandbox id %q", info.ID)
	}
	dir := filepath.Join(StateDir, info.ID)
	l, err := loadLaunch(dir)
	if err != nil {
		return nil, err
	}
	if !info.Paused {
		return adoptRunning(info, dir, l)
	}
	switch {
	case l.volumes:
		return nil, errors.New("microvm: a sandbox with volumes paused by freezing its QEMU is not taken over paused")
	case l.egress:
		return nil, errors.New("microvm: a paused sandbox with network is not taken over (its egress session was the previous server's)")
	}
	// The saved guest goes on in its session (no token is sent); one
	// paused by an older airlock has none recorded.
	token, _ := readTokenFile(dir)
	group, err := cgroups.Lookup(info.ID)
	if err != nil {
		return nil, fmt.Errorf("microvm: the paused sandbox's cgroup: %w", err)
	}
	l.group = group
	conns, err := connPair()
	if err != nil {
		return nil, err
	}
	gone := &qemuProc{pid: info.Pid, pidfd: -1, done: make(chan struct{})}
	close(gone.done)
	vm := &VM{id: info.ID, dir: dir, launch: l, token: token, group: group, enforced: info.Enforced, cur: gone, suspended: true,
		conn: conns[0], agent: newPortRelay(conns[1]), ended: make(chan struct{})}
	return vm, nil
}

// connPair returns the two ends of a connected socket pair: the manager's
// agent connection and the host side of the agent port's relay.
func connPair() ([2]net.Conn, error) {
	var conns [2]net.Conn
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return conns, fmt.Errorf("microvm: socketpair: %w", err)
	}
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "agent")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 0 {
				unix.Close(fds[1])
			} else {
				conns[0].Close()
			}
			return conns, fmt.Errorf("microvm: agent connection: %w", err)
		}
	}
	return conns, nil
}

// adoptRunning takes over a running VM that a previous server started: its
// QEMU (info.Pid, which the state directory's runningFile must name too,
// checked against its start time through a pidfd, so that a reused pid is
// not taken), its monitor and ports (the sockets in its state directory,
// which must be that QEMU's own: SO_PEERCRED), a new session on each port
// with the VM's token (the guest saw its previous host go), its volume
// daemons (runningFile) and its cgroup, whose limits stand. Anything that
// does not match fails the takeover: the manager then ends the VM, and
// only it. Its agent is reached with DialAgent, its egress listeners with
// Listeners.
func adoptRunning(info tier.AdoptInfo, dir string, l *launch) (_ tier.Instance, err error) {
	rs, err := readRunning(dir)
	if err != nil {
		return nil, err
	}
	if rs.QEMU.Pid != info.Pid || rs.QEMU.StartTime != info.StartTime {
		return nil, fmt.Errorf("microvm: the state directory names QEMU pid %d (start %d), the server's record pid %d (start %d)",
			rs.QEMU.Pid, rs.QEMU.StartTime, info.Pid, info.StartTime)
	}
	token, err := readTokenFile(dir)
	if err != nil {
		return nil, err
	}
	pidfd, err := pidfdOf(rs.QEMU, "its QEMU")
	if err != nil {
		return nil, err
	}
	proc := &qemuProc{pid: info.Pid, pidfd: pidfd, done: make(chan struct{})}
	proc.waitErr = fmt.Errorf("qemu (pid %d, started by a previous server) exited; its exit status went to that server", info.Pid)
	go func() {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, -1)
			if err == unix.EINTR || (err == nil && n == 0) {
				continue
			}
			break
		}
		close(proc.done)
	}()
	var daemons []int
	var mux *egressMux
	var egressHost net.Conn
	defer func() {
		if err == nil {
			return
		}
		proc.close()
		if mux != nil {
			mux.sess.Close()
			egressHost.Close()
		}
		for _, fd := range daemons {
			unix.Close(fd)
		}
		// QEMU is left for the manager to kill (it checks the pid it
		// recorded): the pidfd goes once QEMU has exited.
		go func() {
			<-proc.done
			unix.Close(pidfd)
		}()
		err = fmt.Errorf("microvm: take over the running %s: %w", info.ID, err)
	}()
	for _, d := range rs.Daemons {
		fd, err := daemonPidfd(d)
		if err != nil {
			return nil, err
		}
		daemons = append(daemons, fd)
	}
	if l.volumes && len(daemons) == 0 {
		return nil, errors.New("its volume daemons are not recorded")
	}
	group, err := cgroups.Lookup(info.ID)
	if err != nil {
		return nil, fmt.Errorf("its cgroup: %w", err)
	}
	l.group = group
	deadline := time.Now().Add(AdoptWait)
	qf, err := dialSock(filepath.Join(dir, qmpSock), info.Pid)
	if err != nil {
		return nil, err
	}
	if proc.qmp, err = newQMP(qf); err != nil {
		return nil, err
	}
	if err := proc.qmp.handshake(time.Until(deadline)); err != nil {
		return nil, err
	}
	if err := resumeStopped(proc.qmp, deadline); err != nil {
		return nil, err
	}
	if proc.agent, err = adoptPort(filepath.Join(dir, agentSock), info.Pid, token, deadline, proc.done); err != nil {
		return nil, fmt.Errorf("its agent port: %w", err)
	}
	if l.egress {
		if len(info.Listen) == 0 {
			return nil, errors.New("no egress listen addresses to serve its network on")
		}
		if proc.egress, err = adoptPort(filepath.Join(dir, egressSock), info.Pid, token, deadline, proc.done); err != nil {
			return nil, fmt.Errorf("its egress port: %w", err)
		}
		if mux, egressHost, err = egressPair(info.Listen); err != nil {
			return nil, fmt.Errorf("its egress: %w", err)
		}
	}
	conns, err := connPair()
	if err != nil {
		return nil, err
	}
	vm := &VM{id: info.ID, dir: dir, launch: l, token: token, group: group, enforced: info.Enforced, cur: proc, mux: mux,
		daemons: daemons, adopted: true, conn: conns[0], ended: make(chan struct{})}
	vm.agent = newPortRelay(conns[1])
	vm.agent.attach(proc.agent, proc.agent)
	if mux != nil {
		vm.egress = newPortRelay(egressHost)
		vm.egress.attach(proc.egress, proc.egress)
	}
	vm.follow(proc)
	return vm, nil
}

// resumeStopped runs on a guest that a killed server left stopped (in the
// middle of a pause to disk or a snapshot): a migration under way is
// cancelled first, and must have stopped by deadline. Its ports' holds
// were that server's.
func resumeStopped(q *qmpConn, deadline time.Time) error {
	st, err := q.status()
	if err != nil {
		return err
	}
	switch st {
	case "running":
		return nil
	case "finish-migrate", "postmigrate", "paused":
		q.run("migrate_cancel", nil, nil)
		for st != "paused" && st != "postmigrate" {
			if time.Now().After(deadline) {
				return fmt.Errorf("its migration did not stop (state %q)", st)
			}
			time.Sleep(50 * time.Millisecond)
			if st, err = q.status(); err != nil {
				return err
			}
		}
		if _, err := q.run("cont", nil, nil); err != nil {
			return fmt.Errorf("run the guest a killed server left stopped: %w", err)
		}
		return nil
	}
	return fmt.Errorf("its guest is in state %q", st)
}

// DialAgent implements tier.AgentDialer for a VM taken over running: the
// manager's end of the relay to the agent's new session, ready for a
// client's hello.
func (v *VM) DialAgent(ctx context.Context) (net.Conn, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.adopted || v.conn == nil {
		return nil, errors.New("microvm: only a VM taken over running is dialed")
	}
	return v.conn, nil
}

// Listeners implements tier.Listening: the egress listeners of a VM taken
// over running with network (its new egress session's).
func (v *VM) Listeners() []net.Listener {
	if !v.adopted || v.mux == nil {
		return nil
	}
	return v.mux.listeners()
}

// daemonPids lists the volume daemons' pids.
func daemonPids(vols []*volumeShare) []int {
	var out []int
	for _, v := range vols {
		if v.daemon.Process != nil {
			out = append(out, v.daemon.Process.Pid)
		}
	}
	return out
}

// killDaemons kills the volume daemons of a VM taken over running, through
// their pidfds, and closes those.
func killDaemons(fds []int) {
	for _, fd := range fds {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 5000)
		unix.Close(fd)
	}
}
