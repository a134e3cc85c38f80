package microvm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	osuser "os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// BootTimeout bounds a guest's boot, up to its agent's ready line.
var BootTimeout = 5 * time.Minute

// maxCmdline is the x86 kernel's command line size (COMMAND_LINE_SIZE).
const maxCmdline = 2048

// nobody is QEMU's host uid and gid when the sandbox has no leased range.
const nobody = 65534

// qemuOverhead is the memory QEMU itself may use on the host beyond the
// guest's RAM (its cgroup's limit is the guest's plus this).
const qemuOverhead = 192 << 20

// tcgBufferMiB caps QEMU's translated-code buffer under TCG (within
// qemuOverhead).
const tcgBufferMiB = 64

// Tier is the microvm tier (tier.Tier).
type Tier struct{}

// Name implements tier.Tier.
func (Tier) Name() policy.Runtime { return policy.RuntimeMicroVM }

// Available implements tier.Tier: QEMU, a guest kernel with its modules
// and a static busybox are installed, and airlock is root (QEMU's cgroup).
func (Tier) Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: airlock must run as root (QEMU's cgroup)", errNotReady)
	}
	if _, err := qemuPath(); err != nil {
		return err
	}
	k, err := kernelPath()
	if err != nil {
		return err
	}
	if _, err := moduleFiles(k); err != nil {
		return err
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		return fmt.Errorf("microvm: mkfs.erofs not found (apt-get install erofs-utils)")
	}
	if _, err := os.Stat(busyboxPath); err != nil {
		return fmt.Errorf("microvm: %s: %w (apt-get install busybox-static)", busyboxPath, err)
	}
	return nil
}

// Caps implements tier.Tier: the agent gets a connected socket (relayed
// to its virtio-serial port by portRelay); pause is to disk (Suspend:
// QEMU's migration to a file, QEMU quits, the memory is freed; a sandbox
// with volumes is frozen instead, see Suspend); a running guest is
// snapshotted and forked (Snapshot, Fork), on an image root too (the
// snapshot carries a copy of its upper disk), not with volumes (QEMU
// cannot migrate vhost-user devices) nor, for a fork, with network (the
// fork's egress stream would continue its original's session); an image
// root is the image's layers as a read-only disk under a writable one
// (RootImage); network goes through the host's egress proxy over a
// virtio-serial port (egressMux); volumes are shared over virtio-fs
// (shareVolumes). A running sandbox is taken over by a restarted server
// (AdoptRunning: its QEMU and volume daemons outlive the server, which
// reconnects to the sockets in its state directory), a sandbox paused to
// disk is taken over paused (Adopt). No attaching a network later, nor
// pool.
func (Tier) Caps() tier.Caps {
	return tier.Caps{ConnectedAgent: true, Pause: tier.PauseCheckpoint, MemorySnapshot: true, SnapshotEnvironments: true,
		ImageRoots: true, Network: true, Volumes: true, AdoptRunning: true}
}

// Remove implements tier.Tier: the cgroups (QEMU's, its volume daemons')
// and state directory of a QEMU a crash left behind.
func (Tier) Remove(id string) {
	if g, err := cgroups.Lookup(id); err == nil && g != nil {
		g.Thaw() // a QEMU frozen by a pause dies of SIGKILL only once thawed
		g.Kill()
		g.Destroy()
	}
	if g, err := cgroups.Lookup(volumeGroup(id)); err == nil {
		destroyGroup(g)
	}
	if validID(id) {
		dir := filepath.Join(StateDir, id)
		killRecordedDaemons(dir)
		os.RemoveAll(dir)
	}
}

// killRecordedDaemons kills the volume daemons runningFile in dir names
// (outside QEMU's cgroup, they outlived a server): each only if it is
// still the process recorded (start time) and runs VirtiofsdBinary, so
// that a tampered record kills nothing else.
func killRecordedDaemons(dir string) {
	rs, err := readRunning(dir)
	if err != nil {
		return
	}
	var fds []int
	for _, d := range rs.Daemons {
		if fd, err := daemonPidfd(d); err == nil {
			fds = append(fds, fd)
		}
	}
	killDaemons(fds)
}

// daemonPidfd opens a pidfd of the recorded volume daemon d if it is still
// that process and runs VirtiofsdBinary.
func daemonPidfd(d procID) (int, error) {
	fd, err := pidfdOf(d, "a volume daemon")
	if err != nil {
		return -1, err
	}
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", d.Pid)); err != nil || exe != VirtiofsdBinary {
		unix.Close(fd)
		return -1, fmt.Errorf("microvm: pid %d is not a volume daemon (%s, %v)", d.Pid, exe, err)
	}
	return fd, nil
}

var pruneOnce sync.Once

// pruneRunDirs removes the state directories of one-shot runs
// (native.NewRunID: run-PID-...) whose launcher has died without removing
// them (killed with SIGKILL, say); a server's sandboxes' go with the
// sandbox (Remove).
func pruneRunDirs() {
	ents, _ := os.ReadDir(StateDir)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "run-")
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		if pid, err := strconv.Atoi(pidStr); err == nil && pid > 0 && unix.Kill(pid, 0) == unix.ESRCH {
			os.RemoveAll(filepath.Join(StateDir, e.Name()))
		}
	}
}

// StateDir holds a directory per VM (root's, 0700), removed with it.
var StateDir = "/run/airlock/microvm"

// validID reports whether id can name a state directory.
func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Start implements tier.Tier: it boots the guest and returns once the
// agent inside has opened its port. cfg.Stdin must be a connected socket
// (Caps.ConnectedAgent): the agent's stream is relayed between it and
// QEMU's end of the virtio-serial port (portRelay, which carries it on
// across a pause to disk).
func (Tier) Start(cfg native.Config) (tier.Instance, []net.Listener, error) {
	return start(cfg, "")
}

// Fork implements tier.Forker: a new sandbox from the memory snapshot in
// directory image (VM.Snapshot), restored by a QEMU of its own started
// with -incoming from the snapshot's state, with a copy-on-write copy of
// the snapshot's upper disk for an image root. Its agent channel is its
// own QEMU's socket: a fork cannot reach its original's channel, nor the
// original its fork's. cfg is as for Start, with the original's policy
// (the guest's memory size, vCPUs and devices must be the original's).
func (Tier) Fork(cfg native.Config, image string) (tier.Instance, []net.Listener, error) {
	if len(cfg.Volumes) > 0 {
		return nil, nil, fmt.Errorf("%w: microvm: a fork with volumes", tier.ErrNotSupported)
	}
	return start(cfg, image)
}

// start boots a guest, or restores one from the memory snapshot in
// directory snapshot.
func start(cfg native.Config, snapshot string) (tier.Instance, []net.Listener, error) {
	p := cfg.Policy
	switch {
	case cfg.Image != nil && cfg.Image.Dir == "":
		return nil, nil, fmt.Errorf("microvm: an image root needs a per-sandbox directory")
	case p.Network.Mode != policy.NetNone && len(cfg.Listen) == 0:
		return nil, nil, fmt.Errorf("microvm: network %q needs the egress proxy's listen addresses (the guest has no network device)", p.Network.Mode)
	case cfg.Stdin == nil || len(cfg.Args) < 2:
		return nil, nil, fmt.Errorf("microvm: want the agent's arguments and a connected socket")
	case cfg.AgentBinary == "":
		return nil, nil, fmt.Errorf("microvm: no agent binary")
	}
	agentArgs := cfg.Args[1:]
	if len(cfg.Listen) > 0 {
		agentArgs = append(agentArgs[:len(agentArgs):len(agentArgs)], "--egress-listen="+strings.Join(cfg.Listen, ","))
	}
	for _, a := range agentArgs {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\") || strings.HasPrefix(a, "--serial") || strings.HasPrefix(a, "--egress=") || strings.HasPrefix(a, "--env-file") {
			return nil, nil, fmt.Errorf("microvm: agent argument %q cannot go on the kernel command line", a)
		}
	}
	var incoming *os.File
	if snapshot != "" {
		f, err := os.Open(filepath.Join(snapshot, memoryFile))
		if err != nil {
			return nil, nil, fmt.Errorf("microvm: fork: the snapshot's memory: %w", err)
		}
		defer f.Close()
		incoming = f
	}
	q, err := qemuPath()
	if err != nil {
		return nil, nil, err
	}
	kernel, err := kernelPath()
	if err != nil {
		return nil, nil, err
	}
	acc, err := chooseAccel()
	if err != nil {
		return nil, nil, err
	}
	initrd, err := Initramfs(kernel, cfg.AgentBinary)
	if err != nil {
		return nil, nil, err
	}
	id := cfg.ID
	if id == "" {
		id = native.NewID()
	}
	// The VM's state directory: it lives exactly as long as the sandbox,
	// across the QEMU processes a pause to disk ends and a resume starts,
	// and holds its id range's lease meanwhile (LeaseDir).
	if !validID(id) {
		return nil, nil, fmt.Errorf("microvm: bad sandbox id %q", id)
	}
	stateDir := filepath.Join(StateDir, id)
	pruneOnce.Do(pruneRunDirs)
	if err := os.MkdirAll(StateDir, 0o700); err != nil {
		return nil, nil, &native.SetupError{Step: "state dir", Err: err}
	}
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		return nil, nil, &native.SetupError{Step: "state dir", Err: err}
	}
	var token []byte
	if snapshot != "" {
		// The fork's agent is in the middle of its original's session,
		// whose token it holds (none from an older airlock's snapshot: a
		// server restart then loses the fork, saying so).
		if token, err = readTokenFile(snapshot); err == nil {
			err = writeToken(stateDir, token)
		} else if errors.Is(err, os.ErrNotExist) {
			token, err = nil, nil
		}
	} else {
		token, err = newToken(stateDir)
	}
	if err != nil {
		os.RemoveAll(stateDir)
		return nil, nil, &native.SetupError{Step: "token", Err: err}
	}
	l := &launch{dir: stateDir, q: q, policy: p, hostRoot: cfg.Image == nil, stdout: cfg.Stdout, stderr: cfg.Stderr, surviveParent: cfg.SurviveParent}
	// Egress: a second port whose connections the manager's proxy serves,
	// through a relay (the mux's session outlives a QEMU process).
	var mux *egressMux
	var egressEnv string
	var egressHost net.Conn
	if len(cfg.Listen) > 0 {
		if mux, egressHost, err = egressPair(cfg.Listen); err != nil {
			os.RemoveAll(stateDir)
			return nil, nil, &native.SetupError{Step: "egress", Err: err}
		}
		l.egress = true
		egressEnv = " AIRLOCK_EGRESS=1"
	}
	var vols []*volumeShare
	// failEarly undoes the above for an error before QEMU starts.
	failEarly := func(step string, err error) (tier.Instance, []net.Listener, error) {
		stopVolumes(vols)
		os.RemoveAll(stateDir)
		if mux != nil {
			mux.sess.Close()
			egressHost.Close()
		}
		return nil, nil, &native.SetupError{Step: step, Err: err}
	}
	filesEnv := " AIRLOCK_FILES=1" // the boot archive (spawn)
	// Volumes: a virtiofsd per volume, over vhost-user, which needs the
	// guest's memory shared with it and modern virtio-mmio.
	volEnv := ""
	if vols, err = shareVolumes(cfg.Volumes, id, p.Limits.CPUs, cfg.AllowDegraded, cfg.SurviveParent); err != nil {
		return failEarly("volumes", err)
	}
	var volSpecs []string
	for _, v := range vols {
		volSpecs = append(volSpecs, v.tag+":"+v.target)
	}
	if len(vols) > 0 {
		volEnv = " AIRLOCK_VOLUMES=" + strings.Join(volSpecs, ",")
	}
	// The root: the host's /usr image under the initramfs, or an image's
	// layers as one read-only EROFS disk under a writable upper disk.
	rootKind := "host"
	if cfg.Image == nil {
		usr, err := UsrImage()
		if err != nil {
			return failEarly("usr image", err)
		}
		l.disks = append(l.disks, "-drive", "file="+usr+",if=none,format=raw,readonly=on,id=usr",
			"-device", "virtio-blk-device,drive=usr,serial=airlock-usr")
	} else {
		lower, err := RootImage(cfg.Image.Layers)
		if err != nil {
			return failEarly("image root", err)
		}
		if snapshot != "" {
			err = forkUpperDisk(filepath.Join(snapshot, rootDiskFile), cfg.Image.Dir)
		} else {
			var upper *os.File
			if upper, err = upperDisk(cfg.Image.Dir, p.Limits.DiskBytes); err == nil {
				upper.Close()
			}
		}
		if err != nil {
			return failEarly("image root", err)
		}
		l.upper = filepath.Join(cfg.Image.Dir, upperDiskFile)
		rootKind = "image"
		l.disks = append(l.disks, "-drive", "file="+lower+",if=none,format=raw,readonly=on,id=lower",
			"-device", "virtio-blk-device,drive=lower,serial=airlock-lower")
	}
	memMiB := (p.Limits.MemoryBytes + (1<<20 - 1)) >> 20
	if memMiB < 128 {
		memMiB = 128 // the guest kernel and agent need this much to boot
	}
	cpus := int(p.Limits.CPUs + 0.999)
	if cpus < 1 {
		cpus = 1
	}
	tmpfs := p.Limits.DiskBytes
	if tmpfs <= 0 || tmpfs > memMiB<<20/2 {
		tmpfs = memMiB << 20 / 2
	}

	// QEMU keeps its own copy of the initramfs (the agent binary is most
	// of it) beside the guest's memory: count it, or a guest that touches
	// all its memory gets QEMU OOM-killed mid boot.
	var initrdBytes int64
	if fi, err := os.Stat(initrd); err == nil {
		initrdBytes = fi.Size()
	}
	group, cgErr := cgroups.Create(id, cgroups.Limits{MemoryBytes: memMiB<<20 + qemuOverhead + initrdBytes, CPUs: p.Limits.CPUs, Pids: 64})
	if cgErr != nil {
		if !cfg.AllowDegraded {
			return failEarly("cgroups", cgErr)
		}
		group = nil
	}
	l.group = group
	fail := func(step string, err error) (tier.Instance, []net.Listener, error) {
		if group != nil {
			group.Kill()
			group.Destroy()
		}
		return failEarly(step, err)
	}
	user := fmt.Sprintf("%d:%d", p.User.UID, p.User.GID)
	timing := ""
	if acc.accel == AccelTCG {
		// Under TCG on a loaded host the kernel cannot calibrate its
		// clocks against the emulated PIT and stalls: give it the TSC
		// rate and the delay loop instead of measuring them.
		timing = " " + TCGKernelArgs
	}
	appendLine := fmt.Sprintf("console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init%s AIRLOCK_USER=%s AIRLOCK_TMPFS=%d AIRLOCK_ROOT=%s%s%s -- %s",
		timing, user, tmpfs, rootKind, egressEnv, filesEnv+volEnv, strings.Join(agentArgs, " "))
	if len(appendLine) >= maxCmdline {
		// The kernel would cut it short: an argument or a volume dropped.
		return fail("kernel command line", fmt.Errorf("%d bytes, the guest kernel takes fewer than %d (too many volumes or agent arguments)", len(appendLine), maxCmdline))
	}
	// Under TCG the translated code lives in a buffer QEMU sizes at up to
	// 1 GiB and fills as the guest runs: cap it, so that QEMU stays within
	// its cgroup's allowance (qemuOverhead).
	machine := "microvm,pit=on,pic=on,rtc=on"
	accelArg := "tcg,tb-size=" + fmt.Sprint(tcgBufferMiB)
	cpu := "max"
	if acc.accel == AccelKVM {
		machine, accelArg, cpu = "microvm", "kvm", "host"
	}
	var memArgs []string
	if len(vols) > 0 {
		machine += ",memory-backend=mem"
		memArgs = []string{"-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", memMiB),
			"-global", "virtio-mmio.force-legacy=false"}
	}
	l.base = append([]string{"-M", machine, "-accel", accelArg, "-cpu", cpu, "-m", fmt.Sprint(memMiB), "-smp", fmt.Sprint(cpus),
		"-name", "airlock-" + id, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
		// A guest kernel panic ends QEMU through the pvpanic device, from
		// the kernel's panic notifiers, before (and whatever becomes of) its
		// emergency restart: under TCG with several vCPUs that restart
		// sometimes never reached QEMU (docs/microvm.md).
		"-device", "pvpanic", "-action", "panic=exit-failure",
		"-device", "virtio-serial-device",
		"-kernel", kernel, "-initrd", initrd, "-append", appendLine}, memArgs...)
	// QEMU runs as the first host id of the sandbox's leased range (or
	// nobody without one), with no capabilities: it needs none, and two
	// sandboxes' QEMUs cannot signal or trace each other.
	qemuID := cfg.HostIDBase
	if qemuID <= 0 {
		qemuID = nobody
	}
	l.cred = &syscall.Credential{Uid: uint32(qemuID), Gid: uint32(qemuID), Groups: []uint32{}}
	if acc.accel == AccelKVM {
		g, err := osuser.LookupGroup("kvm")
		if err != nil {
			return fail("qemu identity", fmt.Errorf("group kvm (owner of /dev/kvm): %w", err))
		}
		gid, _ := strconv.Atoi(g.Gid)
		l.cred.Groups = []uint32{uint32(gid)}
	}
	l.volumes = len(vols) > 0
	if err := l.save(stateDir); err != nil {
		return fail("state dir", err)
	}
	proc, err := l.spawn(incoming, vols)
	if err != nil {
		return fail("start qemu", err)
	}
	if err := writeRunning(stateDir, proc.pid, daemonPids(vols)); err != nil {
		proc.kill()
		return fail("state dir", err)
	}
	host, err := net.FileConn(cfg.Stdin)
	if err != nil {
		proc.kill()
		return fail("agent socket", err)
	}
	vm := &VM{id: id, dir: stateDir, launch: l, token: token, group: group, vols: vols, cur: proc, mux: mux, ended: make(chan struct{})}
	vm.enforced = rt.Enforced{
		{Name: "vm", State: rt.StateOK, Detail: "qemu microvm, " + acc.why + "; the workload runs on its own guest kernel (" + kernel + "), the host kernel sees only QEMU"},
		{Name: "seccomp", State: rt.StateOK, Detail: "QEMU's -sandbox (obsolete, elevateprivileges, spawn and resourcecontrol denied)"},
		{Name: "network", State: rt.StateOK, Detail: netDetail(cfg)},
		{Name: "filesystem", State: rt.StateOK, Detail: fsDetail(cfg, tmpfs)},
		{Name: "identity", State: rt.StateOK, Detail: fmt.Sprintf("QEMU runs as host uid and gid %d, without capabilities (bounding set empty, no_new_privs); in the guest the agent is PID 1 (root, capabilities reduced to kill, setuid, setgid) and the workload runs as %s", qemuID, user)},
		{Name: "mountns", State: rt.StateOK, Detail: "QEMU's jail: pivot_root onto a read-only tmpfs holding only bind mounts of its own files (its binary, libraries and firmware, the kernel, initramfs and read-only images; read-only, nosuid, nodev, noexec but for its code), the host's root detached; no /proc, /sys, /etc or state directory"},
		{Name: "pidns", State: rt.StateOK, Detail: "QEMU is PID 1 of pid, IPC and UTS namespaces of its own (and a cgroup namespace rooted at its cgroup): it sees and can signal no other process"},
		{Name: "netns", State: rt.StateOK, Detail: "QEMU's network namespace is empty (a loopback, down): it has no network, and the guest no network device"},
	}
	if group != nil {
		vm.enforced = append(vm.enforced, rt.Layer{Name: "cgroup", State: rt.StateOK,
			Detail: fmt.Sprintf("%s around QEMU: guest memory %d MiB (the workload's limit, enforced by the guest kernel) + %d MiB for QEMU, %d vCPUs%s", group.Describe(), memMiB, qemuOverhead>>20, cpus, volumeGroupDetail(vols))})
	} else {
		vm.enforced = append(vm.enforced, rt.Layer{Name: "cgroup", State: rt.StateMissing, Detail: "QEMU's host resources NOT limited: " + cgErr.Error()})
	}

	if snapshot == "" {
		// Wait for the agent's first session, then relay; the egress
		// port's session follows (its agent waits for the token).
		err = session(proc.agent, token, BootTimeout, proc.done)
		if err == nil && mux != nil {
			err = session(proc.egress, token, BootTimeout, proc.done)
		}
	} else {
		// The restored agent is in the middle of its original's session:
		// no ready line; the guest runs once the state is loaded.
		err = proc.waitRunning(BootTimeout)
	}
	if err != nil {
		host.Close()
		vm.Destroy()
		return nil, nil, &native.SetupError{Step: "boot", Err: err}
	}
	vm.agent = newPortRelay(host)
	vm.agent.attach(proc.agent, proc.agent)
	if mux != nil {
		vm.egress = newPortRelay(egressHost)
		vm.egress.attach(proc.egress, proc.egress)
	}
	vm.follow(proc)
	if mux != nil {
		return vm, mux.listeners(), nil
	}
	return vm, nil, nil
}

// netDetail describes the guest's network for enforced.
func netDetail(cfg native.Config) string {
	if len(cfg.Listen) == 0 {
		return "none: the guest has no network device"
	}
	return fmt.Sprintf("no network device: the guest's loopback listeners %s are carried over the virtio-serial port airlock.egress to the host's egress proxy (policy %s, allowlist, credential injection and network log as for native)", strings.Join(cfg.Listen, ", "), cfg.Policy.Network.Mode)
}

// fsDetail describes the guest's files for enforced.
func fsDetail(cfg native.Config, tmpfs int64) string {
	vols := ""
	if len(cfg.Volumes) > 0 {
		var ts []string
		for _, v := range cfg.Volumes {
			ts = append(ts, v.Target)
		}
		vols = fmt.Sprintf("; volumes at %s over virtio-fs (nosuid, nodev), each served by a virtiofsd (QEMU's, sandbox=namespace) confined to the volume's directory", strings.Join(ts, ", "))
	}
	return fsRootDetail(cfg, tmpfs) + vols
}

// fsRootDetail describes the guest's root for enforced.
func fsRootDetail(cfg native.Config, tmpfs int64) string {
	if cfg.Image == nil {
		return fmt.Sprintf("initramfs root (busybox, read-only); /usr a read-only EROFS image (virtio-blk, QEMU opens it read-only) of the host's python3, its standard library and their shared libraries; tmpfs /workspace and /tmp of %d bytes each inside guest memory; no other host file", tmpfs)
	}
	size := max(cfg.Policy.Limits.DiskBytes, minUpperDisk)
	return fmt.Sprintf("image root: an overlay (nosuid, nodev) in the guest of the image's %d layers, flattened into one read-only EROFS disk (QEMU opens it read-only), and a per-sandbox writable ext4 upper disk of %d bytes (QEMU gets it as a file descriptor; the host never mounts it), /workspace on it; tmpfs /tmp of %d bytes inside guest memory; no other host file", len(cfg.Image.Layers), size, tmpfs)
}
