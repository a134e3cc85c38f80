package microvm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	osuser "os/user"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/launcher"
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
// to its virtio-serial port); pause freezes QEMU's cgroup, which stops
// the whole guest (its memory stays resident); an image root is the
// image's layers as a read-only disk under a writable one (RootImage);
// network goes through the host's egress proxy over a virtio-serial port
// (egressMux); volumes are shared over virtio-fs (shareVolumes). Nothing
// else yet: no attaching a network later,
// snapshots, adoption or pool.
func (Tier) Caps() tier.Caps {
	return tier.Caps{ConnectedAgent: true, Pause: tier.PauseFreeze, ImageRoots: true, Network: true, Volumes: true}
}

// Remove implements tier.Tier: the cgroup of a QEMU a crash left behind.
func (Tier) Remove(id string) {
	if g, err := cgroups.Lookup(id); err == nil && g != nil {
		g.Kill()
		g.Destroy()
	}
}

// Start implements tier.Tier: it boots the guest and returns once the
// agent inside has opened its port. cfg.Stdin must be a connected socket
// (Caps.ConnectedAgent): the agent's stream is relayed between it and
// QEMU's end of the virtio-serial port.
func (Tier) Start(cfg native.Config) (tier.Instance, []net.Listener, error) {
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
	// QEMU's descriptors beyond stdio: extra[i] is its fd 3+i.
	var extra []*os.File
	addFD := func(f *os.File) int {
		extra = append(extra, f)
		return 2 + len(extra)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, &native.SetupError{Step: "socketpair", Err: err}
	}
	qemuEnd, tierEnd := os.NewFile(uintptr(fds[0]), "qemu"), os.NewFile(uintptr(fds[1]), "tier")
	defer qemuEnd.Close()
	devices := []string{"-chardev", fmt.Sprintf("socket,id=agent,fd=%d", addFD(qemuEnd)),
		"-device", "virtserialport,chardev=agent,name=airlock.agent"}
	// Egress: a second port whose connections the manager's proxy serves.
	var mux *egressMux
	var egressEnv string
	if len(cfg.Listen) > 0 {
		efds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			tierEnd.Close()
			return nil, nil, &native.SetupError{Step: "socketpair", Err: err}
		}
		eq := os.NewFile(uintptr(efds[0]), "qemu-egress")
		defer eq.Close()
		if mux, err = newEgressMux(os.NewFile(uintptr(efds[1]), "egress"), cfg.Listen); err != nil {
			tierEnd.Close()
			return nil, nil, &native.SetupError{Step: "egress", Err: err}
		}
		devices = append(devices, "-chardev", fmt.Sprintf("socket,id=egress,fd=%d", addFD(eq)),
			"-device", "virtserialport,chardev=egress,name=airlock.egress")
		egressEnv = " AIRLOCK_EGRESS=1"
	}
	var vols []*volumeShare
	// failEarly undoes the above for an error before QEMU starts.
	failEarly := func(step string, err error) (tier.Instance, []net.Listener, error) {
		stopVolumes(vols)
		tierEnd.Close()
		if mux != nil {
			mux.sess.Close()
		}
		return nil, nil, &native.SetupError{Step: step, Err: err}
	}
	// Files the policy places (read-only host files): an archive on a disk.
	filesEnv := ""
	if files, err := filesArchive(p, cfg.Image == nil); err != nil {
		return failEarly("files", err)
	} else {
		defer files.Close()
		devices = append(devices, "-add-fd", fmt.Sprintf("fd=%d,set=2", addFD(files)),
			"-drive", "file=/dev/fdset/2,if=none,format=raw,readonly=on,id=files",
			"-device", "virtio-blk-device,drive=files,serial=airlock-files")
		filesEnv = " AIRLOCK_FILES=1"
	}
	// Volumes: a virtiofsd per volume, over vhost-user, which needs the
	// guest's memory shared with it and modern virtio-mmio.
	volEnv := ""
	if vols, err = shareVolumes(cfg.Volumes, cfg.SurviveParent); err != nil {
		return failEarly("volumes", err)
	}
	var volSpecs []string
	for i, v := range vols {
		defer v.qemu.Close()
		devices = append(devices, "-chardev", fmt.Sprintf("socket,id=vfs%d,fd=%d", i, addFD(v.qemu)),
			"-device", fmt.Sprintf("vhost-user-fs-device,chardev=vfs%d,tag=%s", i, v.tag))
		volSpecs = append(volSpecs, v.tag+":"+v.target)
	}
	if len(vols) > 0 {
		volEnv = " AIRLOCK_VOLUMES=" + strings.Join(volSpecs, ",")
	}
	// The root: the host's /usr image under the initramfs, or an image's
	// layers as one read-only EROFS disk under a writable upper disk.
	var disks []string
	var upper, upperRO *os.File
	rootKind := "host"
	if cfg.Image == nil {
		usr, err := UsrImage()
		if err != nil {
			return failEarly("usr image", err)
		}
		disks = append(disks, "-drive", "file="+usr+",if=none,format=raw,readonly=on,id=usr",
			"-device", "virtio-blk-device,drive=usr,serial=airlock-usr")
	} else {
		lower, err := RootImage(cfg.Image.Layers)
		if err != nil {
			return failEarly("image root", err)
		}
		if upper, err = upperDisk(cfg.Image.Dir, p.Limits.DiskBytes); err != nil {
			return failEarly("image root", err)
		}
		defer upper.Close()
		// QEMU reopens a disk read-only while it sets the disk up: its fd
		// set holds the file opened both ways.
		if upperRO, err = os.Open(upper.Name()); err != nil {
			return failEarly("image root", err)
		}
		defer upperRO.Close()
		rootKind = "image"
		disks = append(disks, "-drive", "file="+lower+",if=none,format=raw,readonly=on,id=lower",
			"-device", "virtio-blk-device,drive=lower,serial=airlock-lower",
			"-add-fd", fmt.Sprintf("fd=%d,set=1", addFD(upper)), "-add-fd", fmt.Sprintf("fd=%d,set=1", addFD(upperRO)),
			"-drive", "file=/dev/fdset/1,if=none,format=raw,id=upper,cache=writeback",
			"-device", "virtio-blk-device,drive=upper,serial=airlock-upper")
	}
	id := cfg.ID
	if id == "" {
		id = native.NewID()
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
	args := []string{"-M", machine, "-accel", accelArg, "-cpu", cpu, "-m", fmt.Sprint(memMiB), "-smp", fmt.Sprint(cpus),
		"-name", "airlock-" + id, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
		// A guest kernel panic ends QEMU through the pvpanic device, from
		// the kernel's panic notifiers, before (and whatever becomes of) its
		// emergency restart: under TCG with several vCPUs that restart
		// sometimes never reached QEMU (docs/microvm.md).
		"-device", "pvpanic", "-action", "panic=exit-failure",
		"-device", "virtio-serial-device",
		"-kernel", kernel, "-initrd", initrd, "-append", appendLine}
	args = append(append(append(args, memArgs...), devices...), disks...)
	cmd := exec.Command(q, args...)
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = cfg.Stdout, cfg.Stderr
	cmd.ExtraFiles = extra
	// QEMU runs as the first host id of the sandbox's leased range (or
	// nobody without one), with no capabilities: it needs none, and two
	// sandboxes' QEMUs cannot signal or trace each other.
	qemuID := cfg.HostIDBase
	if qemuID <= 0 {
		qemuID = nobody
	}
	cred := &syscall.Credential{Uid: uint32(qemuID), Gid: uint32(qemuID), Groups: []uint32{}}
	if acc.accel == AccelKVM {
		g, err := osuser.LookupGroup("kvm")
		if err != nil {
			return fail("qemu identity", fmt.Errorf("group kvm (owner of /dev/kvm): %w", err))
		}
		gid, _ := strconv.Atoi(g.Gid)
		cred.Groups = []uint32{uint32(gid)}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: cred}
	if !cfg.SurviveParent {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	var cgfd *os.File
	if group != nil && group.Version() == 2 && len(group.Dirs()) == 1 {
		if cgfd, err = os.Open(group.Dirs()[0]); err != nil {
			return fail("cgroup", err)
		}
		defer cgfd.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cgfd.Fd())
	}
	// Forked from the launcher thread: the parent-death signal fires when
	// the forking thread exits (runtime/launcher).
	start := cmd.Start
	if cmd.SysProcAttr.Pdeathsig != 0 {
		start = func() error { return launcher.Run(cmd.Start) }
	}
	if err := start(); err != nil {
		return fail("start qemu", err)
	}
	if group != nil && cgfd == nil {
		if err := group.Add(cmd.Process.Pid); err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			return fail("cgroup", err)
		}
	}
	vm := &VM{id: id, cmd: cmd, group: group, vols: vols, done: make(chan struct{})}
	go func() {
		vm.waitErr = cmd.Wait()
		if mux != nil {
			mux.sess.Close() // ends its listeners' Accept
		}
		close(vm.done)
	}()
	vm.enforced = rt.Enforced{
		{Name: "vm", State: rt.StateOK, Detail: "qemu microvm, " + acc.why + "; the workload runs on its own guest kernel (" + kernel + "), the host kernel sees only QEMU"},
		{Name: "seccomp", State: rt.StateOK, Detail: "QEMU's -sandbox (obsolete, elevateprivileges, spawn and resourcecontrol denied)"},
		{Name: "network", State: rt.StateOK, Detail: netDetail(cfg)},
		{Name: "filesystem", State: rt.StateOK, Detail: fsDetail(cfg, tmpfs)},
		{Name: "identity", State: rt.StateOK, Detail: fmt.Sprintf("QEMU runs as host uid and gid %d, without capabilities; in the guest the agent is PID 1 (root, capabilities reduced to kill, setuid, setgid) and the workload runs as %s", qemuID, user)},
	}
	if group != nil {
		vm.enforced = append(vm.enforced, rt.Layer{Name: "cgroup", State: rt.StateOK,
			Detail: fmt.Sprintf("%s around QEMU: guest memory %d MiB (the workload's limit, enforced by the guest kernel) + %d MiB for QEMU, %d vCPUs", group.Describe(), memMiB, qemuOverhead>>20, cpus)})
	} else {
		vm.enforced = append(vm.enforced, rt.Layer{Name: "cgroup", State: rt.StateMissing, Detail: "QEMU's host resources NOT limited: " + cgErr.Error()})
	}

	// Wait for the agent's ready line, then relay.
	ready := make(chan error, 1)
	br := bufio.NewReader(tierEnd)
	go func() {
		line, err := br.ReadString('\n')
		switch {
		case err != nil:
			ready <- fmt.Errorf("guest ended before its agent was ready: %w", err)
		case line != agent.SerialReady:
			ready <- fmt.Errorf("guest agent port: unexpected %q", line)
		default:
			ready <- nil
		}
	}()
	timer := time.NewTimer(BootTimeout)
	defer timer.Stop()
	select {
	case err = <-ready:
	case <-vm.done:
		err = fmt.Errorf("qemu exited during boot: %v", vm.waitErr)
	case <-timer.C:
		err = fmt.Errorf("guest not ready after %s", BootTimeout)
	}
	if err != nil {
		tierEnd.Close()
		vm.Destroy()
		return nil, nil, &native.SetupError{Step: "boot", Err: err}
	}
	host, err := net.FileConn(cfg.Stdin)
	if err != nil {
		tierEnd.Close()
		vm.Destroy()
		return nil, nil, &native.SetupError{Step: "agent socket", Err: err}
	}
	go func() {
		io.Copy(tierEnd, host) // the manager's frames to the guest
		unix.Shutdown(int(tierEnd.Fd()), unix.SHUT_WR)
	}()
	go func() {
		io.Copy(host, br) // the agent's frames to the manager
		host.Close()
	}()
	go func() {
		<-vm.done
		tierEnd.Close()
		host.Close()
	}()
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

// VM is one running guest (tier.Instance).
type VM struct {
	id       string
	cmd      *exec.Cmd
	group    *cgroups.Group
	enforced rt.Enforced
	vols     []*volumeShare
	done     chan struct{}
	waitErr  error
	destroy  sync.Once
}

// Pid is QEMU's.
func (v *VM) Pid() int { return v.cmd.Process.Pid }

// Done is closed when QEMU has exited.
func (v *VM) Done() <-chan struct{} { return v.done }

// Stats reads QEMU's cgroup.
func (v *VM) Stats() (cgroups.Stats, error) {
	if v.group == nil {
		return cgroups.Stats{}, errors.New("microvm: no cgroup")
	}
	return v.group.Stats()
}

// Enforced lists the layers applied.
func (v *VM) Enforced() rt.Enforced { return v.enforced }

// Destroy kills QEMU, waits for it and removes its cgroup.
func (v *VM) Destroy() error {
	var err error
	v.destroy.Do(func() {
		v.cmd.Process.Kill()
		<-v.done
		stopVolumes(v.vols)
		if v.group != nil {
			v.group.Kill()
			if e := v.group.Destroy(); e != nil {
				err = fmt.Errorf("microvm: remove cgroup: %w", e)
			}
		}
	})
	return err
}
