//go:build linux && amd64

package seccomp

import (
	gseccomp "gvisor.dev/gvisor/pkg/seccomp"

	"golang.org/x/sys/unix"
)

const (
	// nativeAuditArch is the only seccomp_data.arch value let through.
	nativeAuditArch = unix.AUDIT_ARCH_X86_64
	// foreignSyscallBit is __X32_SYSCALL_BIT: x86_64 syscall numbers at or
	// above it belong to the x32 ABI.
	foreignSyscallBit = 0x40000000
)

// epermCalls are denied with EPERM in every profile: they change the
// machine, the mount or namespace layout, reach into other processes or
// expose large kernel attack surface.
var epermCalls = []uintptr{
	// Mounts, roots and namespaces.
	unix.SYS_MOUNT,
	unix.SYS_UMOUNT2,
	unix.SYS_PIVOT_ROOT,
	unix.SYS_CHROOT,
	unix.SYS_UNSHARE,
	unix.SYS_SETNS,
	// Other processes' memory and file descriptors.
	unix.SYS_PIDFD_GETFD,
	// Kernel keyrings.
	unix.SYS_KEYCTL,
	unix.SYS_ADD_KEY,
	unix.SYS_REQUEST_KEY,
	// Large in-kernel attack surface.
	unix.SYS_BPF,
	unix.SYS_USERFAULTFD,
	unix.SYS_PERF_EVENT_OPEN,
	unix.SYS_IO_URING_SETUP,
	unix.SYS_IO_URING_ENTER,
	unix.SYS_IO_URING_REGISTER,
	unix.SYS_FANOTIFY_INIT,
	// Kernels and modules.
	unix.SYS_KEXEC_LOAD,
	unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_INIT_MODULE,
	unix.SYS_FINIT_MODULE,
	unix.SYS_DELETE_MODULE,
	unix.SYS_CREATE_MODULE,
	unix.SYS_GET_KERNEL_SYMS,
	unix.SYS_QUERY_MODULE,
	// Machine administration.
	unix.SYS_ACCT,
	unix.SYS_SWAPON,
	unix.SYS_SWAPOFF,
	unix.SYS_SYSLOG,
	unix.SYS_QUOTACTL,
	unix.SYS_QUOTACTL_FD,
	unix.SYS_REBOOT,
	unix.SYS_VHANGUP,
	unix.SYS_NFSSERVCTL,
	unix.SYS__SYSCTL,
	// File handles bypass path-based checks (and Landlock).
	unix.SYS_OPEN_BY_HANDLE_AT,
	unix.SYS_NAME_TO_HANDLE_AT,
	// Clocks.
	unix.SYS_SETTIMEOFDAY,
	unix.SYS_CLOCK_SETTIME,
	unix.SYS_CLOCK_ADJTIME,
	unix.SYS_ADJTIMEX,
	// Obsolete or hardware-level calls.
	unix.SYS_LOOKUP_DCOOKIE,
	unix.SYS_USELIB,
	unix.SYS_USTAT,
	unix.SYS_SYSFS,
	unix.SYS_IOPL,
	unix.SYS_IOPERM,
	// Per-process LDT segments: 16-bit and call-gate tricks that have
	// carried kernel exploits; Docker's default profile denies it too.
	unix.SYS_MODIFY_LDT,
}

// debugCalls are denied with EPERM except in the light profile, where
// debuggers and profilers need them.
var debugCalls = []uintptr{
	unix.SYS_PTRACE,
	unix.SYS_PROCESS_VM_READV,
	unix.SYS_PROCESS_VM_WRITEV,
	unix.SYS_KCMP,
}

// enosysCalls are denied with ENOSYS, which reads as "this kernel does not
// have it": glibc falls back from clone3 to clone, and tools fall back from
// the new mount API to mount(2), which is then denied with a clear EPERM.
var enosysCalls = []uintptr{
	unix.SYS_CLONE3,
	unix.SYS_FSOPEN,
	unix.SYS_FSCONFIG,
	unix.SYS_FSMOUNT,
	unix.SYS_FSPICK,
	unix.SYS_MOVE_MOUNT,
	unix.SYS_OPEN_TREE,
	unix.SYS_OPEN_TREE_ATTR,
	unix.SYS_MOUNT_SETATTR,
}

// namespaceCloneFlags are the clone(2) flags that create namespaces. The
// sandbox already sits in its own namespaces; nesting more is denied.
// CLONE_NEWTIME shares its bit with the exit-signal byte of clone(2), where a
// value of 0x80 or more is not a valid signal anyway.
const namespaceCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUSER | unix.CLONE_NEWPID |
	unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP |
	unix.CLONE_NEWTIME

// Personalities allowed outside the light profile: PER_LINUX, PER_LINUX32,
// UNAME26, UNAME26|PER_LINUX32 and the 0xffffffff query. Notably absent are
// ADDR_NO_RANDOMIZE and READ_IMPLIES_EXEC, which weaken memory protections.
var allowedPersonalities = []uintptr{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// low32 is the mask for int-typed arguments: the kernel ignores the upper
// half of the register, so the filter must too.
const low32 = 0xffffffff

// profileRules returns the gVisor rule sets of a profile for x86_64, in the
// order they must be tried, and how many system calls they deny.
func profileRules(profile string, g Guards) (ruleSets, error) {
	light := profile == ProfileLight

	allow := gseccomp.NewSyscallRules()
	eperm := gseccomp.NewSyscallRules()
	enosys := gseccomp.NewSyscallRules()
	eafnosupport := gseccomp.NewSyscallRules()

	for _, nr := range epermCalls {
		eperm.Set(nr, gseccomp.MatchAll{})
	}
	if !light {
		for _, nr := range debugCalls {
			eperm.Set(nr, gseccomp.MatchAll{})
		}
	}
	for _, nr := range enosysCalls {
		if nr == unix.SYS_CLONE3 && g.Clone3 {
			continue
		}
		enosys.Set(nr, gseccomp.MatchAll{})
	}

	// clone(2): threads and plain forks pass, namespace flags do not.
	allow.Set(unix.SYS_CLONE, gseccomp.PerArg{gseccomp.MaskedEqual(namespaceCloneFlags, 0)})
	eperm.Set(unix.SYS_CLONE, gseccomp.MatchAll{})

	// personality(2): the argument is an unsigned int.
	if !light {
		var ok gseccomp.Or
		for _, p := range allowedPersonalities {
			ok = append(ok, gseccomp.PerArg{gseccomp.MaskedEqual(low32, p)})
		}
		allow.Set(unix.SYS_PERSONALITY, ok)
		eperm.Set(unix.SYS_PERSONALITY, gseccomp.MatchAll{})
	}

	// socket(2), socketpair(2): the domain is an int. Other families get
	// EAFNOSUPPORT, the answer of a kernel built without them.
	families := []uintptr{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6}
	if light {
		families = append(families, unix.AF_NETLINK)
	}
	for _, nr := range []uintptr{unix.SYS_SOCKET, unix.SYS_SOCKETPAIR} {
		var ok gseccomp.Or
		for _, f := range families {
			ok = append(ok, gseccomp.PerArg{gseccomp.MaskedEqual(low32, f)})
		}
		allow.Set(nr, ok)
		eafnosupport.Set(nr, gseccomp.MatchAll{})
	}

	// ioctl(2): the request is an unsigned int; TIOCSTI and TIOCLINUX can
	// push keystrokes into a terminal outside the sandbox.
	eperm.Set(unix.SYS_IOCTL, gseccomp.Or{
		gseccomp.PerArg{gseccomp.AnyValue{}, gseccomp.MaskedEqual(low32, unix.TIOCSTI)},
		gseccomp.PerArg{gseccomp.AnyValue{}, gseccomp.MaskedEqual(low32, unix.TIOCLINUX)},
	})

	if g.NoSetID {
		noSetIDRules(eperm, enosys)
	}
	if g.ProtectID != 0 {
		protectIDRules(eperm, uintptr(g.ProtectID))
	}

	denied := eperm.Size() + enosys.Size() + eafnosupport.Size()
	return ruleSets{
		sets: []gseccomp.RuleSet{
			{Rules: allow, Action: gseccomp.Allow},
			{Rules: eperm, Action: gseccomp.ReturnError.Code(uint16(unix.EPERM))},
			{Rules: enosys, Action: gseccomp.ReturnError.Code(uint16(unix.ENOSYS))},
			{Rules: eafnosupport, Action: gseccomp.ReturnError.Code(uint16(unix.EAFNOSUPPORT))},
		},
		denied: denied,
	}, nil
}

// setIDBits are the mode bits Guards.NoSetID refuses.
var setIDBits = []uintptr{unix.S_ISUID, unix.S_ISGID}

// oTmpfile is __O_TMPFILE, the bit that makes O_TMPFILE create a file
// (unix.O_TMPFILE includes O_DIRECTORY).
const oTmpfile = unix.O_TMPFILE &^ unix.O_DIRECTORY

// modeArg matches a call whose argument mode has
// S_ISUID or S_ISGID set, and, when flags >= 0, whose argument flags
// creates a file.
func modeArg(mode, flags int) gseccomp.Or {
	var or gseccomp.Or
	creating := []uintptr{0}
	if flags >= 0 {
		creating = []uintptr{unix.O_CREAT, oTmpfile}
	}
	for _, bit := range setIDBits {
		for _, c := range creating {
			var args gseccomp.PerArg // nil matchers match any value
			args[mode] = gseccomp.MaskedEqual(bit, bit)
			if flags >= 0 {
				args[flags] = gseccomp.MaskedEqual(c, c)
			}
			or = append(or, args)
		}
	}
	return or
}

// noSetIDRules adds Guards.NoSetID to eperm and enosys.
func noSetIDRules(eperm, enosys gseccomp.SyscallRules) {
	eperm.Set(unix.SYS_CHMOD, modeArg(1, -1))
	eperm.Set(unix.SYS_FCHMOD, modeArg(1, -1))
	eperm.Set(unix.SYS_FCHMODAT, modeArg(2, -1))
	eperm.Set(unix.SYS_FCHMODAT2, modeArg(2, -1))
	eperm.Set(unix.SYS_CREAT, modeArg(1, -1))
	eperm.Set(unix.SYS_MKNOD, modeArg(1, -1))
	eperm.Set(unix.SYS_MKNODAT, modeArg(2, -1))
	eperm.Set(unix.SYS_OPEN, modeArg(2, 1))
	eperm.Set(unix.SYS_OPENAT, modeArg(3, 2))
	enosys.Set(unix.SYS_OPENAT2, gseccomp.MatchAll{})
}

// protectIDRules adds Guards.ProtectID to eperm: the set*id calls with id
// in any of their arguments (ints: the low 32 bits).
func protectIDRules(eperm gseccomp.SyscallRules, id uintptr) {
	for nr, nargs := range map[uintptr]int{
		unix.SYS_SETUID: 1, unix.SYS_SETGID: 1, unix.SYS_SETFSUID: 1, unix.SYS_SETFSGID: 1,
		unix.SYS_SETREUID: 2, unix.SYS_SETREGID: 2, unix.SYS_SETRESUID: 3, unix.SYS_SETRESGID: 3,
	} {
		var or gseccomp.Or
		for i := 0; i < nargs; i++ {
			var args gseccomp.PerArg
			args[i] = gseccomp.MaskedEqual(low32, id)
			or = append(or, args)
		}
		eperm.Set(nr, or)
	}
}
