package microvm

import (
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/runtime/launcher"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

// The jail: like Firecracker's jailer, QEMU is started by a helper (this
// binary, re-executed as jailArg0: Go's SysProcAttr cannot pivot_root)
// that the kernel has put in new mount, pid, network, IPC and UTS
// namespaces. The helper joins QEMU's cgroup (and makes it the root of a
// cgroup namespace of its own), mounts a tmpfs holding only bind mounts of
// what this QEMU opens by path (its binary, shared libraries and
// accelerator module, its firmware directory, the kernel, initramfs and
// read-only images, the directories of its unix sockets, a few device
// nodes; read-only, nosuid, nodev and noexec wherever it can),
// pivot_roots into it and detaches the host's tree, drops its capability
// bounding set, becomes QEMU's uid and gid, sets no_new_privs, re-arms the
// parent-death signal (a change of uid clears it) and, once the server
// has answered that it is still there, execs QEMU. QEMU therefore runs as
// PID 1 of its own pid namespace (the server sees and signals it by its
// host pid), with no network interface but a loopback that is down, and
// with no host path but its own files. Everything QEMU reads or writes
// beyond those comes as a descriptor (its ports, monitor, upper disk,
// boot archive, saved state, vhost-user sockets).
//
// The same helper, without namespaces or a new identity, starts the
// volume daemons in their cgroup (virtiofsd forks its sandbox at once: it
// must be in its cgroup before it runs, which cgroup v1 cannot do at
// fork).

// jailArg0 is the helper's argv[0]: this binary, re-executed, becomes the
// helper in its init (jailInit).
const jailArg0 = "airlock-qemu-jail"

// jailSpec is what the helper does before it execs the program.
type jailSpec struct {
	// Root is an empty directory the helper mounts the jail's tmpfs on (in
	// its own mount namespace); "" for no jail (a volume daemon).
	Root     string     `json:"root,omitempty"`
	Binds    []jailBind `json:"binds,omitempty"`
	Hostname string     `json:"hostname,omitempty"`
	// Procs are cgroup.procs files the helper writes itself into first.
	Procs    []string `json:"procs,omitempty"`
	CgroupNS bool     `json:"cgroupns,omitempty"`
	// Cred, if set, is the identity the program runs as (else root), with
	// no capabilities and no_new_privs.
	Cred      *jailCred `json:"cred,omitempty"`
	Pdeathsig bool      `json:"pdeathsig,omitempty"`
	Sync      int       `json:"sync"` // the helper's end of its socket to the parent
}

type jailCred struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups"`
}

// jailBind is one host path bound into the jail at the same path.
type jailBind struct {
	Path string `json:"path"`
	RW   bool   `json:"rw,omitempty"`
	Exec bool   `json:"exec,omitempty"`
	Dev  bool   `json:"dev,omitempty"`
}

// jailNamespaces are the namespaces a jailed QEMU gets.
const jailNamespaces = syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS

// jailHostname is a jailed QEMU's host name (its UTS namespace's).
const jailHostname = "airlock-vm"

// jailRoot is the (host) directory the helpers mount their jails' tmpfs on,
// each in its own mount namespace: it stays empty on the host.
func jailRoot() string { return StateDir + "-jail" }

// qemuModDir and qemuDataDir are Debian's QEMU module and firmware
// directories.
var (
	qemuModDir  = "/usr/lib/x86_64-linux-gnu/qemu"
	qemuDataDir = "/usr/share/qemu"
)

// jailDevices are the device nodes every jail has (and /dev/kvm under KVM).
var jailDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}

// qemuFiles caches, per QEMU binary, the binary, its shared libraries and
// dynamic loader and its TCG module with its libraries.
var qemuFiles sync.Map // path -> []jailBind

// qemuBinds returns the binds of QEMU's own files.
func qemuBinds(q string, tcg bool) ([]jailBind, error) {
	key := fmt.Sprintf("%s %v", q, tcg)
	if v, ok := qemuFiles.Load(key); ok {
		return v.([]jailBind), nil
	}
	bins := []string{q}
	if tcg {
		// Debian builds TCG as a module QEMU loads from its module directory.
		if m := filepath.Join(qemuModDir, "accel-tcg-x86_64.so"); exists(m) {
			bins = append(bins, m)
		}
	}
	seen := map[string]bool{}
	var paths []string
	for _, b := range bins {
		real, err := filepath.EvalSymlinks(b)
		if err != nil {
			return nil, fmt.Errorf("microvm: jail: %w", err)
		}
		if err := neededLibs(real, seen, &paths); err != nil {
			return nil, err
		}
		f, err := elf.Open(real)
		if err != nil {
			return nil, fmt.Errorf("microvm: jail: %w", err)
		}
		if interp := elfInterp(f); interp != "" {
			paths = append(paths, interp)
		}
		f.Close()
	}
	binds := []jailBind{}
	for _, p := range append(bins, paths...) {
		binds = append(binds, jailBind{Path: p, Exec: true})
	}
	if exists(qemuDataDir) {
		binds = append(binds, jailBind{Path: qemuDataDir})
	}
	qemuFiles.Store(key, binds)
	return binds, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// jailBinds lists what QEMU, started with args, opens by path: its own
// files, the device nodes, the files its options name (-kernel, -initrd,
// -bios, -drive file=, read-only unless the drive is writable) and the
// directories of the unix sockets they name (path=, writable). A path
// option this does not know is not in the jail, and QEMU fails to open
// it: the jail fails closed.
func jailBinds(q string, args []string) ([]jailBind, error) {
	kvm, tcg := false, false
	var files []jailBind
	for i := 0; i+1 < len(args); i++ {
		opt, val := args[i], args[i+1]
		switch opt {
		case "-accel", "-M", "-machine":
			kvm = kvm || strings.HasPrefix(val, "kvm") || strings.Contains(val, "accel=kvm")
			tcg = tcg || strings.HasPrefix(val, "tcg") || strings.Contains(val, "accel=tcg")
		case "-kernel", "-initrd", "-bios":
			files = append(files, jailBind{Path: val})
		case "-drive":
			kv := qemuOpts(val)
			if f := kv["file"]; f != "" && !strings.HasPrefix(f, "/dev/fdset/") {
				files = append(files, jailBind{Path: f, RW: kv["readonly"] != "on"})
			}
		case "-chardev", "-qmp", "-mon", "-incoming":
			kv := qemuOpts(strings.TrimPrefix(val, "unix:"))
			p := kv["path"]
			if p == "" && strings.HasPrefix(val, "unix:") {
				p, _, _ = strings.Cut(strings.TrimPrefix(val, "unix:"), ",")
			}
			if p != "" {
				files = append(files, jailBind{Path: filepath.Dir(p), RW: true})
			}
		}
	}
	for _, f := range files {
		if !filepath.IsAbs(f.Path) {
			return nil, fmt.Errorf("microvm: jail: QEMU path %q is not absolute", f.Path)
		}
	}
	binds, err := qemuBinds(q, tcg)
	if err != nil {
		return nil, err
	}
	binds = append(append([]jailBind{}, binds...), files...)
	devs := jailDevices
	if kvm {
		devs = append(devs[:len(devs):len(devs)], "/dev/kvm")
	}
	for _, d := range devs {
		binds = append(binds, jailBind{Path: d, RW: true, Dev: true})
	}
	return binds, nil
}

// qemuOpts splits a QEMU option value ("a=b,c=d") into its keys; a bare
// first element is key "".
func qemuOpts(v string) map[string]string {
	kv := map[string]string{}
	for i, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(part, "=")
		if !ok && i == 0 {
			k, val = "", part
		}
		kv[k] = val
	}
	return kv
}

// jailedCmd is a helper process that becomes prog once its parent has
// confirmed it is still there (start).
type jailedCmd struct {
	*exec.Cmd
	sync  *os.File // the parent's end
	child *os.File // the helper's end, closed once it runs
	spec  jailSpec
}

// newJailed prepares the helper that runs prog with args after doing
// spec; extra are prog's descriptors from 3 on (its arguments name them).
// spec.Procs are the cgroup.procs files of group (nil: none).
func newJailed(prog string, args []string, extra []*os.File, spec jailSpec, group *cgroups.Group) (*jailedCmd, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("microvm: jail: socketpair: %w", err)
	}
	j := &jailedCmd{sync: os.NewFile(uintptr(fds[0]), "jail-sync"), child: os.NewFile(uintptr(fds[1]), "jail-sync")}
	if group != nil {
		for _, d := range group.Dirs() {
			spec.Procs = append(spec.Procs, filepath.Join(d, "cgroup.procs"))
		}
	}
	spec.Sync = 3 + len(extra)
	b, err := json.Marshal(spec)
	if err != nil {
		j.close()
		return nil, fmt.Errorf("microvm: jail: %w", err)
	}
	j.spec = spec
	j.Cmd = exec.Command("/proc/self/exe", append([]string{string(b), prog}, args...)...)
	j.Args[0] = jailArg0
	j.Env = []string{}
	j.ExtraFiles = append(append([]*os.File{}, extra...), j.child)
	j.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if spec.Root != "" {
		j.SysProcAttr.Cloneflags = jailNamespaces
	}
	return j, nil
}

func (j *jailedCmd) close() {
	j.sync.Close()
	j.child.Close()
}

// jailSetupWait bounds the helper's work up to its exec.
var jailSetupWait = time.Minute

// start starts the helper (from the launcher thread when the program gets
// a parent-death signal) and returns once it has exec'd the program, or
// with the helper's error (the helper is then ended and waited for).
func (j *jailedCmd) start() error {
	defer j.close()
	if j.spec.Root != "" {
		if err := os.MkdirAll(j.spec.Root, 0o700); err != nil {
			return fmt.Errorf("microvm: jail: %w", err)
		}
	}
	startFn := j.Start
	if j.spec.Pdeathsig {
		startFn = func() error { return launcher.Run(j.Start) }
	}
	if err := startFn(); err != nil {
		return fmt.Errorf("microvm: jail: start: %w", err)
	}
	j.child.Close()
	fail := func(err error) error {
		j.Process.Kill()
		j.Wait()
		return err
	}
	c, err := net.FileConn(j.sync)
	if err != nil {
		return fail(fmt.Errorf("microvm: jail: %w", err))
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(jailSetupWait))
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return fail(fmt.Errorf("microvm: jail: the helper ended before it was ready: %w", err))
	}
	if first[0] == 'r' {
		if _, err := c.Write([]byte{'g'}); err != nil {
			return fail(fmt.Errorf("microvm: jail: %w", err))
		}
	}
	// The socket closes on the program's exec; anything before is the
	// helper's error.
	msg, err := io.ReadAll(io.LimitReader(c, 4096))
	if err != nil {
		return fail(fmt.Errorf("microvm: jail: %w", err))
	}
	if first[0] != 'r' {
		msg = append(first[:], msg...)
	}
	if len(msg) > 0 {
		return fail(fmt.Errorf("microvm: jail: %s", strings.TrimSpace(string(msg))))
	}
	return nil
}

func init() {
	if len(os.Args) > 2 && os.Args[0] == jailArg0 {
		jailMain()
	}
}

// jailMain is the helper: it never returns.
func jailMain() {
	runtime.LockOSThread() // the main thread (init's), which execs
	var spec jailSpec
	if err := json.Unmarshal([]byte(os.Args[1]), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "%s: bad spec: %v\n", jailArg0, err)
		os.Exit(125)
	}
	sock := os.NewFile(uintptr(spec.Sync), "sync")
	die := func(step string, err error) {
		msg := fmt.Sprintf("%s: %v", step, err)
		fmt.Fprintln(os.Stderr, jailArg0+": "+msg)
		sock.Write([]byte(msg))
		os.Exit(125)
	}
	if _, err := unix.FcntlInt(uintptr(spec.Sync), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		die("sync socket", err)
	}
	if err := jailSetup(&spec); err != nil {
		die("jail", err)
	}
	if _, err := sock.Write([]byte{'r'}); err != nil {
		os.Exit(125)
	}
	var b [1]byte
	if n, _ := sock.Read(b[:]); n != 1 || b[0] != 'g' {
		os.Exit(125) // the server is gone (before the parent-death signal was armed)
	}
	prog := os.Args[2]
	err := syscall.Exec(prog, append([]string{prog}, os.Args[3:]...), []string{})
	die("exec "+prog, err)
}

// jailSetup does spec, in the helper.
func jailSetup(spec *jailSpec) error {
	for _, p := range spec.Procs {
		if err := os.WriteFile(p, []byte("0"), 0); err != nil {
			return fmt.Errorf("join cgroup: %w", err)
		}
	}
	if spec.CgroupNS {
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return fmt.Errorf("cgroup namespace: %w", err)
		}
	}
	if spec.Root != "" {
		if os.Getpid() != 1 {
			return errors.New("not in a pid namespace of its own")
		}
		if err := jailPivot(spec.Root, spec.Binds); err != nil {
			return err
		}
		if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
	}
	if spec.Cred != nil {
		if err := dropPrivileges(spec.Cred); err != nil {
			return err
		}
	}
	if spec.Pdeathsig {
		// Armed after the change of uid, which clears it.
		if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
			return fmt.Errorf("parent-death signal: %w", err)
		}
	}
	return nil
}

// jailPivot builds the jail's root in a tmpfs on root and pivots into it.
func jailPivot(root string, binds []jailBind) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=1m,nr_inodes=4096"); err != nil {
		return fmt.Errorf("mount the jail's tmpfs: %w", err)
	}
	for _, b := range binds {
		if err := jailBindOne(root, b); err != nil {
			return err
		}
	}
	if err := unix.Mount("", root, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("remount the jail's root read-only: %w", err)
	}
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir: %w", err)
	}
	return nil
}

// jailBindOne binds host path b.Path at the same path under root.
func jailBindOne(root string, b jailBind) error {
	fi, err := os.Stat(b.Path)
	if err != nil {
		return fmt.Errorf("bind %s: %w", b.Path, err)
	}
	dst := filepath.Join(root, b.Path)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("bind %s: %w", b.Path, err)
	}
	if fi.IsDir() {
		err = os.Mkdir(dst, 0o755)
	} else {
		var f *os.File
		if f, err = os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err == nil {
			f.Close()
		}
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("bind %s: %w", b.Path, err)
	}
	if err := unix.Mount(b.Path, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", b.Path, err)
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID)
	if !b.RW {
		flags |= unix.MS_RDONLY
	}
	if !b.Exec {
		flags |= unix.MS_NOEXEC
	}
	if !b.Dev {
		flags |= unix.MS_NODEV
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s: %w", b.Path, err)
	}
	return nil
}

// dropPrivileges empties the capability bounding set, becomes c's
// identity (which clears the permitted and effective capabilities) and
// sets no_new_privs, for the thread that execs.
func dropPrivileges(c *jailCred) error {
	// Capabilities past the kernel's last are EINVAL (there is no /proc
	// here to read cap_last_cap from).
	for cap := 0; cap < 64; cap++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(cap), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d from the bounding set: %w", cap, err)
		}
	}
	groups := make([]int, len(c.Groups))
	for i, g := range c.Groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(int(c.GID), int(c.GID), int(c.GID)); err != nil {
		return fmt.Errorf("setresgid: %w", err)
	}
	if err := syscall.Setresuid(int(c.UID), int(c.UID), int(c.UID)); err != nil {
		return fmt.Errorf("setresuid: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}

// jailed returns the helper that starts QEMU with args and descriptors
// extra (fd 3 on) in its jail, as l.cred, in l.group.
func (l *launch) jailed(args []string, extra []*os.File) (*jailedCmd, error) {
	binds, err := jailBinds(l.q, args)
	if err != nil {
		return nil, err
	}
	spec := jailSpec{Root: jailRoot(), Binds: binds, Hostname: jailHostname, CgroupNS: l.group != nil,
		Cred: &jailCred{UID: l.cred.Uid, GID: l.cred.Gid, Groups: l.cred.Groups}, Pdeathsig: !l.surviveParent}
	j, err := newJailed(l.q, args, extra, spec, l.group)
	if err != nil {
		return nil, err
	}
	j.Stdout, j.Stderr = l.stdout, l.stderr
	return j, nil
}
