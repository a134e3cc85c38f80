package microvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// launch is how to start a sandbox's QEMU: once at boot, and again for
// each resume from a pause to disk. Every QEMU of a sandbox gets the same
// machine, devices in the same order (a migration's state is loaded into
// the devices it was saved from) and disks; what differs is each one's
// descriptors: its ports' sockets, its monitor, its boot archive and the
// file its state is loaded from.
type launch struct {
	dir           string // the VM's state directory: QEMU's sockets, token, records
	q             string
	base          []string // machine, kernel and the devices without descriptors
	disks         []string // the read-only disks, after the devices with descriptors
	policy        policy.Policy
	hostRoot      bool
	upper         string // the writable upper disk's path ("" on the host-derived root)
	egress        bool   // the guest has the egress port
	volumes       bool   // the guest has volumes (it is never saved to disk)
	stdout        io.Writer
	stderr        io.Writer
	cred          *syscall.Credential
	surviveParent bool
	group         *cgroups.Group
}

// launchFile is the file, in a VM's state directory, that records its
// launch for a server that takes the VM over paused after a restart.
const launchFile = "launch.json"

// savedLaunch is launch as launchFile records it.
type savedLaunch struct {
	Q        string        `json:"qemu"`
	Base     []string      `json:"base"`
	Disks    []string      `json:"disks"`
	Policy   policy.Policy `json:"policy"`
	HostRoot bool          `json:"host_root"`
	Upper    string        `json:"upper,omitempty"`
	Egress   bool          `json:"egress,omitempty"`
	Volumes  bool          `json:"volumes,omitempty"`
	UID      uint32        `json:"uid"`
	GID      uint32        `json:"gid"`
	Groups   []uint32      `json:"groups,omitempty"`
	Survive  bool          `json:"survive,omitempty"`
}

// save records l in dir (launchFile), atomically.
func (l *launch) save(dir string) error {
	b, err := json.Marshal(savedLaunch{Q: l.q, Base: l.base, Disks: l.disks, Policy: l.policy, HostRoot: l.hostRoot,
		Upper: l.upper, Egress: l.egress, Volumes: l.volumes, UID: l.cred.Uid, GID: l.cred.Gid, Groups: l.cred.Groups,
		Survive: l.surviveParent})
	if err != nil {
		return fmt.Errorf("microvm: record the launch: %w", err)
	}
	tmp := filepath.Join(dir, launchFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("microvm: record the launch: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, launchFile)); err != nil {
		return fmt.Errorf("microvm: record the launch: %w", err)
	}
	return nil
}

// loadLaunch reads the launch recorded in dir.
func loadLaunch(dir string) (*launch, error) {
	b, err := os.ReadFile(filepath.Join(dir, launchFile))
	if err != nil {
		return nil, fmt.Errorf("microvm: the recorded launch: %w", err)
	}
	var s savedLaunch
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("microvm: the recorded launch: %w", err)
	}
	if s.Q == "" || len(s.Base) == 0 {
		return nil, errors.New("microvm: the recorded launch: no QEMU or arguments")
	}
	return &launch{dir: dir, surviveParent: s.Survive, q: s.Q, base: s.Base, disks: s.Disks, policy: s.Policy, hostRoot: s.HostRoot, upper: s.Upper,
		egress: s.Egress, volumes: s.Volumes, cred: &syscall.Credential{Uid: s.UID, Gid: s.GID, Groups: s.Groups}}, nil
}

// qemuProc is one QEMU process of a sandbox, with the host's ends of its
// ports and monitor.
type qemuProc struct {
	cmd     *exec.Cmd // nil for a QEMU another server started (adopted, or gone)
	pid     int
	pidfd   int      // an adopted QEMU's (cmd is nil), else -1
	agent   *os.File // the agent port's socket
	egress  *os.File // the egress port's socket (nil without network)
	qmp     *qmpConn
	done    chan struct{}
	waitErr error
}

// Upper disk and snapshot file names.
const (
	upperDiskFile = "upper.ext4"
	memoryFile    = "memory.mig"          // a VM's state (QEMU's migration stream), in a pause or snapshot image
	rootDiskFile  = tier.SnapshotRootDisk // a snapshot's copy of the upper disk
)

// spawn starts a QEMU: a guest booting, or, with incoming, one whose state
// QEMU loads from that file (-incoming) before it runs. vols are the
// volume daemons' sockets (for the first QEMU only: vhost-user devices do
// not migrate, so a sandbox with volumes is never resumed from disk).
func (l *launch) spawn(incoming *os.File, vols []*volumeShare) (*qemuProc, error) {
	// QEMU's descriptors beyond stdio: extra[i] is its fd 3+i. Each is
	// QEMU's alone once it runs: this process closes its copies.
	var extra []*os.File
	closeExtra := func() {
		for _, f := range extra {
			if f != incoming {
				f.Close()
			}
		}
		extra = nil
	}
	defer closeExtra()
	addFD := func(f *os.File) int {
		extra = append(extra, f)
		return 2 + len(extra)
	}
	proc := &qemuProc{done: make(chan struct{}), pidfd: -1}
	// QEMU's ends: listening sockets in the state directory, which this
	// server connects to once QEMU runs, and a restarted one again.
	listen := func(name string) (int, error) {
		f, err := listenSock(filepath.Join(l.dir, name))
		if err != nil {
			return 0, err
		}
		return addFD(f), nil
	}
	ports := []string{"agent"} // the ports' chardev ids
	if l.egress {
		ports = append(ports, "egress")
	}
	fail := func(err error) (*qemuProc, error) {
		for _, f := range []*os.File{proc.agent, proc.egress} {
			if f != nil {
				f.Close()
			}
		}
		if proc.qmp != nil {
			proc.qmp.close()
		}
		return nil, err
	}
	agentFD, err := listen(agentSock)
	if err != nil {
		return fail(err)
	}
	devices := []string{"-chardev", fmt.Sprintf("socket,id=agent,fd=%d,server=on,wait=off", agentFD),
		"-device", "virtserialport,chardev=agent,name=airlock.agent"}
	if l.egress {
		egressFD, err := listen(egressSock)
		if err != nil {
			return fail(err)
		}
		devices = append(devices, "-chardev", fmt.Sprintf("socket,id=egress,fd=%d,server=on,wait=off", egressFD),
			"-device", "virtserialport,chardev=egress,name=airlock.egress")
	}
	// Files the policy places (read-only host files) and the environment:
	// an archive on a disk.
	files, err := filesArchive(l.policy, l.hostRoot)
	if err != nil {
		return fail(fmt.Errorf("files: %w", err))
	}
	devices = append(devices, "-add-fd", fmt.Sprintf("fd=%d,set=2", addFD(files)),
		"-drive", "file=/dev/fdset/2,if=none,format=raw,readonly=on,id=files",
		"-device", "virtio-blk-device,drive=files,serial=airlock-files")
	for i, v := range vols {
		devices = append(devices, "-chardev", fmt.Sprintf("socket,id=vfs%d,fd=%d", i, addFD(v.qemu)),
			"-device", fmt.Sprintf("vhost-user-fs-device,chardev=vfs%d,tag=%s", i, v.tag))
	}
	disks := l.disks
	if l.upper != "" {
		// QEMU reopens a disk read-only while it sets the disk up: its fd
		// set holds the file opened both ways. Without image locking: the
		// disk is this QEMU's alone (the next one, after a pause to disk,
		// opens it once this one has quit; a fork has a copy), and the
		// locks QEMU holds on the read-only descriptor kept it from
		// taking its write lock back after a snapshot's migration.
		rw, err := os.OpenFile(l.upper, os.O_RDWR, 0)
		if err != nil {
			return fail(fmt.Errorf("upper disk: %w", err))
		}
		ro, err := os.Open(l.upper)
		if err != nil {
			rw.Close()
			return fail(fmt.Errorf("upper disk: %w", err))
		}
		disks = append(disks[:len(disks):len(disks)], "-add-fd", fmt.Sprintf("fd=%d,set=1", addFD(rw)), "-add-fd", fmt.Sprintf("fd=%d,set=1", addFD(ro)),
			"-drive", "file=/dev/fdset/1,if=none,format=raw,id=upper,cache=writeback,file.locking=off",
			"-device", "virtio-blk-device,drive=upper,serial=airlock-upper")
	}
	qmpFD, err := listen(qmpSock)
	if err != nil {
		return fail(err)
	}
	mon := []string{"-chardev", fmt.Sprintf("socket,id=qmp,fd=%d,server=on,wait=off", qmpFD), "-mon", "chardev=qmp,mode=control"}
	if incoming != nil {
		mon = append(mon, "-incoming", fmt.Sprintf("fd:%d", addFD(incoming)))
	}
	args := append(append(append(append([]string{}, l.base...), devices...), disks...), mon...)
	// QEMU runs in a jail of its own (jail_linux.go): its namespaces, its
	// cgroup, only its own files, its uid without capabilities.
	cmd, err := l.jailed(args, extra)
	if err != nil {
		return fail(err)
	}
	if err := cmd.start(); err != nil {
		return fail(err)
	}
	// Now only QEMU holds its sockets; this server connects to them (the
	// connections wait in their backlogs until QEMU accepts them): its
	// exit is an end of file on ours, so the monitor's handshake below
	// does not wait for a dead QEMU.
	closeExtra()
	proc.cmd, proc.pid = cmd.Cmd, cmd.Process.Pid
	go func() {
		proc.waitErr = cmd.Wait()
		close(proc.done)
	}()
	dial := func(name string) *os.File {
		if err != nil {
			return nil
		}
		var f *os.File
		f, err = dialSock(filepath.Join(l.dir, name), 0)
		return f
	}
	qmpEnd := dial(qmpSock)
	proc.agent = dial(agentSock)
	if l.egress {
		proc.egress = dial(egressSock)
	}
	if err == nil {
		proc.qmp, err = newQMP(qmpEnd)
		qmpEnd = nil
	}
	if qmpEnd != nil {
		qmpEnd.Close()
	}
	if err != nil {
		proc.kill()
		return fail(err)
	}
	if err := proc.qmp.handshake(BootTimeout); err != nil {
		return fail(proc.exitErr(err))
	}
	// A guest restored from a saved state must find its ports connected
	// as they were when it was saved, or it would see its host go:
	// QEMU has accepted the connections before it runs the guest.
	if err := proc.qmp.waitConnected(BootTimeout, ports); err != nil {
		return fail(proc.exitErr(err))
	}
	return proc, nil
}

// exitErr is err (a failed monitor command) explained by QEMU's exit when
// QEMU ended (a saved state it could not load, say); QEMU is ended and
// waited for either way.
func (p *qemuProc) exitErr(err error) error {
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.kill()
		return err
	}
	return fmt.Errorf("qemu exited (%v): %w", p.waitErr, err)
}

// kill ends the process and waits for it.
func (p *qemuProc) kill() {
	if p.cmd != nil {
		p.cmd.Process.Kill()
	} else if p.pidfd >= 0 {
		select {
		case <-p.done: // its pidfd may be closed
		default:
			unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0)
		}
	}
	<-p.done
}

// close closes the host's ends of p's ports and monitor.
func (p *qemuProc) close() {
	for _, f := range []*os.File{p.agent, p.egress} {
		if f != nil {
			f.Close()
		}
	}
	if p.qmp != nil {
		p.qmp.close()
	}
}

// closePidfd closes an adopted QEMU's pidfd once it has exited.
func (p *qemuProc) closePidfd() {
	select {
	case <-p.done:
		if p.pidfd >= 0 {
			unix.Close(p.pidfd)
			p.pidfd = -1
		}
	default:
	}
}

// waitRunning waits, up to wait, for a QEMU started with -incoming to
// have loaded its state and run the guest.
func (p *qemuProc) waitRunning(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		st, err := p.qmp.status()
		if err != nil {
			return p.exitErr(err)
		}
		switch st {
		case "running":
			return nil
		case "paused":
			// The state was saved from a stopped guest (the global
			// state migrates its run state): run it.
			if _, err := p.qmp.run("cont", nil, nil); err != nil {
				return err
			}
			continue
		case "inmigrate", "prelaunch", "restore-vm":
		default:
			return fmt.Errorf("qemu's state after loading the saved state is %q, not running", st)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("qemu did not load the saved state in %s", wait)
		}
		select {
		case <-p.done:
			return fmt.Errorf("qemu exited while loading the saved state: %v", p.waitErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// errGone is returned for an operation on a VM that has ended.
var errGone = errors.New("microvm: the guest has ended")
