//go:build linux && amd64

// Command probe tries dangerous system calls from inside a sandbox and
// prints one JSON object that maps each check name to a verdict.
//
// Verdicts:
//
//	"allowed"              the call succeeded (its effect was undone or harmless)
//	"denied:EPERM"         the call failed with EPERM
//	"denied:ENOSYS"        the call failed with ENOSYS
//	"denied:EAFNOSUPPORT"  the call failed with EAFNOSUPPORT
//	"EINVAL", "ENOENT"...  the call failed with another errno (its name)
//	"error: ..."           the check itself could not run
//
// The three "denied:" errnos are the ones airlock's seccomp filter returns;
// the kernel can return them on its own too, so compare against a run
// without the filter to tell who refused. Besides the checks the object
// holds facts about the process: seccomp_mode, no_new_privs, cap_eff,
// cap_bnd, cap_amb (from /proc/self/status), uid and gid, and those of PID
// 1: init_gid (its real, effective, saved and fs gids) and init_groups.
//
// Every check is chosen to be harmless when it succeeds: arguments point at
// paths that do not exist, at the probe itself, or at invalid values the
// kernel rejects after its permission checks; calls that would change the
// process (unshare, chroot, setns, personality) run in a forked child that
// exits at once. ptrace_attach_1 attaches to pid 1 (and detaches at once)
// when the probe runs in its own PID namespace, where pid 1 is the sandbox's
// init; in the host's PID namespace, or when that cannot be told, it attaches
// to a throwaway child of its own instead, so that an unfiltered run never
// stops the real init. AIRLOCK_PROBE_PTRACE_PID overrides the target (0
// means the throwaway child); the fact ptrace_target says which one was
// used ("1", "child" or a pid).
//
// Modes:
//
//	probe         run every check, print the JSON object
//	probe int80   make a 32-bit int $0x80 getpid; print "alive" if the
//	              process survives (under airlock's filter it dies of SIGSYS);
//	              print "fault" and exit 3 if the kernel has no 32-bit gate
//	probe x32     make an x32-ABI getpid; print "alive" if the process
//	              survives (under airlock's filter it dies of SIGSYS)
//	probe true    exit 0 at once (used by the exec_child check)
//
// It exists for linux/amd64 only. Build it static:
// CGO_ENABLED=0 go build ./internal/probe.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// missingPath is a path that does not exist anywhere the probe runs.
const missingPath = "/nonexistent-airlock-probe"

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "int80":
			runInt80()
			return
		case "x32":
			runX32()
			return
		case "true":
			return
		default:
			fmt.Fprintf(os.Stderr, "probe: unknown mode %q (want int80, x32 or true)\n", os.Args[1])
			os.Exit(2)
		}
	}
	out := map[string]string{}
	for _, c := range checks() {
		out[c.name] = verdict(c.fn())
	}
	for k, v := range facts() {
		out[k] = v
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "probe: write result: %v\n", err)
		os.Exit(1)
	}
}

// runInt80 performs a getpid through the i386 system call gate. On a
// kernel without 32-bit emulation the gate faults before seccomp sees the
// call; that case prints "fault" and exits with status 3.
func runInt80() {
	debug.SetPanicOnFault(true)
	defer func() {
		if r := recover(); r != nil {
			fmt.Printf("fault: no 32-bit system call gate (%v)\n", r)
			os.Exit(3)
		}
	}()
	pid := int80Getpid()
	fmt.Printf("alive pid=%d\n", pid)
}

// runX32 makes getpid through the x32 ABI (number | __X32_SYSCALL_BIT).
// Kernels without x32 answer ENOSYS, but seccomp sees the call first, so
// under airlock's filter the process dies of SIGSYS on every kernel.
func runX32() {
	const x32GetPID = 0x40000000 | 39
	r, _, e := syscall.RawSyscall(x32GetPID, 0, 0, 0)
	if e != 0 {
		fmt.Printf("alive errno=%s\n", unix.ErrnoName(e))
		return
	}
	fmt.Printf("alive pid=%d\n", r)
}

// check is one named probe; fn returns nil when the call succeeded.
type check struct {
	name string
	fn   func() error
}

// verdict turns a check's result into its verdict string.
func verdict(err error) string {
	if err == nil {
		return "allowed"
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return "error: " + err.Error()
	}
	switch errno {
	case unix.EPERM, unix.ENOSYS, unix.EAFNOSUPPORT:
		return "denied:" + unix.ErrnoName(errno)
	}
	if name := unix.ErrnoName(errno); name != "" {
		return name
	}
	return "errno" + strconv.Itoa(int(errno))
}

// errnoErr returns nil for 0 and the errno otherwise.
func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// fdResult closes a file descriptor a successful call returned.
func fdResult(fd uintptr, e syscall.Errno) error {
	if e != 0 {
		return e
	}
	unix.Close(int(fd))
	return nil
}

// raw makes a system call and returns only its errno.
func raw(trap uintptr, args ...uintptr) error {
	var a [6]uintptr
	copy(a[:], args)
	_, _, e := unix.Syscall6(trap, a[0], a[1], a[2], a[3], a[4], a[5])
	return errnoErr(e)
}

// rawFD makes a system call that returns a file descriptor and closes it.
func rawFD(trap uintptr, args ...uintptr) error {
	var a [6]uintptr
	copy(a[:], args)
	fd, _, e := unix.Syscall6(trap, a[0], a[1], a[2], a[3], a[4], a[5])
	return fdResult(fd, e)
}

// cstr returns a NUL-terminated copy of s as a system call argument. The
// bytes are kept alive by the returned slice.
func cstr(s string) (uintptr, []byte) {
	b := append([]byte(s), 0)
	return uintptr(unsafe.Pointer(&b[0])), b
}

func checks() []check {
	return []check{
		{"io_uring_setup", checkIOUring},
		{"bpf", checkBPF},
		{"userfaultfd", func() error {
			const uffdUserModeOnly = 1
			return rawFD(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|uffdUserModeOnly)
		}},
		{"perf_event_open", checkPerf},
		{"keyctl", func() error {
			_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 0, 0, 0)
			return err
		}},
		{"add_key", func() error {
			// The process keyring dies with the probe.
			_, err := unix.AddKey("user", "airlock-probe", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
			return err
		}},
		{"request_key", func() error {
			// A NULL callout: ENOKEY when allowed, no upcall to userspace.
			typ, b1 := cstr("user")
			desc, b2 := cstr("airlock-probe-missing")
			err := raw(unix.SYS_REQUEST_KEY, typ, desc, 0, 0)
			runtime.KeepAlive(b1)
			runtime.KeepAlive(b2)
			return err
		}},
		{"unshare_user", func() error { return inChild(unix.SYS_UNSHARE, unix.CLONE_NEWUSER) }},
		{"unshare_ns", func() error {
			return inChild(unix.SYS_UNSHARE, unix.CLONE_NEWNS|unix.CLONE_NEWUTS|unix.CLONE_NEWIPC|unix.CLONE_NEWNET)
		}},
		{"clone3", func() error {
			// A NULL, zero-sized clone_args never creates a process.
			return raw(unix.SYS_CLONE3, 0, 0)
		}},
		{"clone_newns", func() error { return forkWith(unix.CLONE_NEWNS) }},
		{"clone_newuser", func() error { return forkWith(unix.CLONE_NEWUSER) }},
		{"clone_plain", func() error { return forkWith(0) }},
		{"mount", func() error {
			src, b1 := cstr("none")
			dst, b2 := cstr(missingPath)
			fs, b3 := cstr("tmpfs")
			err := raw(unix.SYS_MOUNT, src, dst, fs, 0, 0)
			runtime.KeepAlive(b1)
			runtime.KeepAlive(b2)
			runtime.KeepAlive(b3)
			return err
		}},
		{"umount2", func() error { return unix.Unmount(missingPath, 0) }},
		{"pivot_root", func() error { return unix.PivotRoot(missingPath+"/a", missingPath+"/b") }},
		{"chroot", func() error {
			p, b := cstr("/")
			err := inChild(unix.SYS_CHROOT, p)
			runtime.KeepAlive(b)
			return err
		}},
		{"ptrace_attach_1", checkPtrace},
		{"process_vm_readv", checkProcessVM(false)},
		{"process_vm_writev", checkProcessVM(true)},
		{"kcmp", func() error {
			const kcmpFile = 0
			pid := uintptr(os.Getpid())
			return raw(unix.SYS_KCMP, pid, pid, kcmpFile, 1, 1)
		}},
		{"pidfd_getfd", checkPidfdGetfd},
		// Becoming the agent's uid (native.AgentUID): refused by the kernel
		// without CAP_SETUID, by seccomp for a root workload that has it.
		{"setuid_agent", func() error { return inChild(unix.SYS_SETUID, 65532) }},
		{"setresuid_agent", func() error { return inChild(unix.SYS_SETRESUID, ^uintptr(0), ^uintptr(0), 65532) }},
		// What apt does before running its download methods as _apt
		// (nogroup, 65534): refused without CAP_SETGID, allowed for a
		// root workload.
		{"setgroups_nogroup", func() error {
			groups := []uint32{65534}
			err := inChild(unix.SYS_SETGROUPS, 1, uintptr(unsafe.Pointer(&groups[0])))
			runtime.KeepAlive(groups)
			return err
		}},
		{"setns", checkSetns},
		{"open_by_handle_at", func() error {
			// handle_bytes == 0 is rejected after the capability check.
			var handle [8]byte
			dirfd := unix.AT_FDCWD
			return rawFD(unix.SYS_OPEN_BY_HANDLE_AT, uintptr(dirfd),
				uintptr(unsafe.Pointer(&handle[0])), unix.O_RDONLY)
		}},
		{"name_to_handle_at", func() error {
			_, _, err := unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
			return err
		}},
		{"settimeofday", func() error {
			// Both pointers NULL: permission check only, nothing is set.
			return raw(unix.SYS_SETTIMEOFDAY, 0, 0)
		}},
		{"clock_settime", func() error {
			// CLOCK_MONOTONIC cannot be set: EINVAL when allowed.
			ts := unix.Timespec{Sec: 1}
			return unix.ClockSettime(unix.CLOCK_MONOTONIC, &ts)
		}},
		{"kexec_load", func() error {
			// Unknown flag and too many segments: EINVAL when allowed.
			return raw(unix.SYS_KEXEC_LOAD, 0, 1000, 0, 0x8000)
		}},
		{"init_module", func() error {
			// A zero-length image: ENOEXEC when allowed.
			args, b := cstr("")
			err := raw(unix.SYS_INIT_MODULE, 0, 0, args)
			runtime.KeepAlive(b)
			return err
		}},
		{"acct", func() error { return unix.Acct(missingPath + "/acct") }},
		{"swapon", func() error {
			p, b := cstr(missingPath)
			err := raw(unix.SYS_SWAPON, p, 0)
			runtime.KeepAlive(b)
			return err
		}},
		{"syslog", func() error {
			const syslogActionSizeBuffer = 10
			return raw(unix.SYS_SYSLOG, syslogActionSizeBuffer, 0, 0)
		}},
		{"reboot", func() error {
			// Wrong magic numbers: EINVAL when allowed.
			return raw(unix.SYS_REBOOT, 0, 0, 0, 0)
		}},
		{"iopl", func() error {
			// Level 0 is the level every process already has.
			return raw(unix.SYS_IOPL, 0)
		}},
		{"modify_ldt", func() error {
			// func 0 reads the LDT into a buffer: allowed, it returns a byte
			// count (0 for an empty LDT) and no error.
			var buf [16]byte
			err := raw(unix.SYS_MODIFY_LDT, 0, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
			runtime.KeepAlive(&buf)
			return err
		}},
		{"personality_bad", func() error {
			const readImpliesExec = 0x0400000
			return inChild(unix.SYS_PERSONALITY, readImpliesExec)
		}},
		{"personality_query", func() error { return raw(unix.SYS_PERSONALITY, 0xffffffff) }},
		{"socket_alg", socketCheck(unix.AF_ALG, unix.SOCK_SEQPACKET, 0)},
		{"socket_packet", socketCheck(unix.AF_PACKET, unix.SOCK_DGRAM, 0)},
		{"socket_netlink", socketCheck(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)},
		{"socket_vsock", socketCheck(unix.AF_VSOCK, unix.SOCK_STREAM, 0)},
		{"socket_inet", socketCheck(unix.AF_INET, unix.SOCK_STREAM, 0)},
		{"socket_inet6", socketCheck(unix.AF_INET6, unix.SOCK_DGRAM, 0)},
		{"socket_unix", socketCheck(unix.AF_UNIX, unix.SOCK_STREAM, 0)},
		{"socketpair_unix", func() error {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err == nil {
				unix.Close(fds[0])
				unix.Close(fds[1])
			}
			return err
		}},
		// A NULL argument makes an allowed TIOCSTI/TIOCLINUX fail with
		// EFAULT (or ENOTTY when fd 0 is no terminal) without injecting.
		{"ioctl_tiocsti", func() error { return raw(unix.SYS_IOCTL, 0, unix.TIOCSTI, 0) }},
		{"ioctl_tiocsti_high", func() error { return raw(unix.SYS_IOCTL, 0, 0xffffffff00005412, 0) }},
		{"ioctl_tioclinux", func() error { return raw(unix.SYS_IOCTL, 0, unix.TIOCLINUX, 0) }},
		{"ioctl_tcgets", func() error {
			_, err := unix.IoctlGetTermios(0, unix.TCGETS)
			return err
		}},
		{"fsopen", func() error {
			fd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"fspick", func() error {
			fd, err := unix.Fspick(unix.AT_FDCWD, missingPath, unix.FSPICK_CLOEXEC)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"fsmount", func() error { return rawFD(unix.SYS_FSMOUNT, ^uintptr(0), 0, 0) }},
		{"fsconfig", func() error { return raw(unix.SYS_FSCONFIG, ^uintptr(0), unix.FSCONFIG_CMD_CREATE, 0, 0, 0) }},
		{"open_tree", func() error {
			// Without OPEN_TREE_CLONE this is an O_PATH open of "/".
			fd, err := unix.OpenTree(unix.AT_FDCWD, "/", unix.OPEN_TREE_CLOEXEC)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"move_mount", func() error {
			return unix.MoveMount(-1, missingPath, -1, missingPath, 0)
		}},
		{"mount_setattr", func() error {
			// attr == NULL with size 0 is rejected after the filter.
			p, b := cstr(missingPath)
			err := raw(unix.SYS_MOUNT_SETATTR, ^uintptr(0), p, 0, 0, 0)
			runtime.KeepAlive(b)
			return err
		}},
		{"exec_child", func() error {
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find own binary: %w", err)
			}
			if err := exec.Command(self, "true").Run(); err != nil {
				return fmt.Errorf("run %s true: %w", self, err)
			}
			return nil
		}},
	}
}

func checkIOUring() error {
	var params [120]byte // struct io_uring_params, zeroed
	return rawFD(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])))
}

func checkBPF() error {
	// union bpf_attr for BPF_MAP_CREATE: a one-entry array map.
	var attr [72]byte
	const bpfMapTypeArray = 2
	*(*uint32)(unsafe.Pointer(&attr[0])) = bpfMapTypeArray
	*(*uint32)(unsafe.Pointer(&attr[4])) = 4 // key_size
	*(*uint32)(unsafe.Pointer(&attr[8])) = 4 // value_size
	*(*uint32)(unsafe.Pointer(&attr[12])) = 1
	const bpfMapCreate = 0
	return rawFD(unix.SYS_BPF, bpfMapCreate, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
}

func checkPerf() error {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_TASK_CLOCK,
		Bits:   unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

// initialPIDNamespace is the inode number of the host's PID namespace
// (PROC_PID_INIT_INO), the same on every Linux system.
const initialPIDNamespace = "pid:[4026531836]"

// ptraceTarget picks the process ptrace_attach_1 attaches to:
// AIRLOCK_PROBE_PTRACE_PID if set, else pid 1 when the probe runs in its own
// PID namespace (the sandbox's init), else 0. Zero, from either source,
// means a throwaway child of the probe: attaching to the host's real init
// would stop it.
func ptraceTarget() (int, error) {
	if s := os.Getenv("AIRLOCK_PROBE_PTRACE_PID"); s != "" {
		pid, err := strconv.Atoi(s)
		if err != nil {
			return 0, fmt.Errorf("AIRLOCK_PROBE_PTRACE_PID=%q: %w", s, err)
		}
		return pid, nil
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil || ns == initialPIDNamespace {
		return 0, nil
	}
	return 1, nil
}

func checkPtrace() error {
	pid, err := ptraceTarget()
	if err != nil {
		return err
	}
	// The tracer is a thread: attach, wait and detach from the same one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if pid == 0 {
		child, errno := rawFork(0, true, unix.SYS_PAUSE, [6]uintptr{})
		if errno != 0 {
			return fmt.Errorf("fork a ptrace target: %v", errno)
		}
		defer func() {
			unix.Kill(child, unix.SIGKILL)
			waitChild(child)
		}()
		pid = child
	}
	if err := unix.PtraceAttach(pid); err != nil {
		return err
	}
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for tracee %d: %w", pid, err)
		}
		break
	}
	if err := unix.PtraceDetach(pid); err != nil {
		return fmt.Errorf("detach from %d: %w", pid, err)
	}
	return nil
}

// checkProcessVM copies between two buffers of the probe itself.
func checkProcessVM(write bool) func() error {
	return func() error {
		src := []byte("airlock")
		dst := make([]byte, len(src))
		local := []unix.Iovec{{Base: &dst[0]}}
		local[0].SetLen(len(dst))
		remote := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: len(src)}}
		var err error
		if write {
			local[0].Base = &src[0]
			remote[0].Base = uintptr(unsafe.Pointer(&dst[0]))
			_, err = unix.ProcessVMWritev(os.Getpid(), local, remote, 0)
		} else {
			_, err = unix.ProcessVMReadv(os.Getpid(), local, remote, 0)
		}
		runtime.KeepAlive(src)
		runtime.KeepAlive(dst)
		return err
	}
}

func checkPidfdGetfd() error {
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, 1, 0)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

func checkSetns() error {
	fd, err := unix.Open("/proc/self/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open own uts namespace: %w", err)
	}
	defer unix.Close(fd)
	// Rejoining the namespace the probe is already in, in a child.
	return inChild(unix.SYS_SETNS, uintptr(fd), unix.CLONE_NEWUTS)
}

func socketCheck(domain, typ, proto int) func() error {
	return func() error {
		fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, proto)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
}

// facts reads what the sandbox set up for the process.
func facts() map[string]string {
	target := "1"
	if pid, err := ptraceTarget(); err != nil || pid != 1 {
		target = "child"
		if pid > 1 {
			target = strconv.Itoa(pid)
		}
	}
	out := map[string]string{
		"ptrace_target": target,
		"uid":           strconv.Itoa(os.Getuid()),
		"gid":           strconv.Itoa(os.Getgid()),
	}
	want := map[string]string{
		"Seccomp":    "seccomp_mode",
		"NoNewPrivs": "no_new_privs",
		"CapEff":     "cap_eff",
		"CapBnd":     "cap_bnd",
		"CapAmb":     "cap_amb",
	}
	// The groups of PID 1 (in a sandbox's PID namespace, its agent or
	// init): whatever of them the probe lacks, setgroups could add.
	if b, err := os.ReadFile("/proc/1/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if key, val, ok := strings.Cut(line, ":"); ok && (key == "Gid" || key == "Groups") {
				out["init_"+strings.ToLower(key)] = strings.Join(strings.Fields(val), " ")
			}
		}
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		for _, k := range want {
			out[k] = "error: " + err.Error()
		}
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if name, wanted := want[key]; ok && wanted {
			out[name] = strings.TrimSpace(val)
		}
	}
	for _, k := range want {
		if _, ok := out[k]; !ok {
			out[k] = "missing"
		}
	}
	return out
}
