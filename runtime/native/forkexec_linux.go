package native

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The runtime hooks that syscall.forkExec uses around fork. They block
// signals and poison the stack guard so that the child can never grow its
// stack or allocate by accident.

//go:linkname runtimeBeforeFork syscall.runtime_BeforeFork
func runtimeBeforeFork()

//go:linkname runtimeAfterFork syscall.runtime_AfterFork
func runtimeAfterFork()

//go:linkname runtimeAfterForkInChild syscall.runtime_AfterForkInChild
func runtimeAfterForkInChild()

// op is one mount(src, path, fstype, flags, data) the child performs.
// Every pointer is allocated by the parent before fork: the child only
// reads. (Directories and files of the root are made by the parent, in the
// root template.)
type op struct {
	path   *byte
	src    *byte
	fstype *byte
	data   *byte
	flags  uintptr
	// mknod, when nonzero, makes this op create a mount point instead of
	// mounting: a directory (S_IFDIR|perm) or an empty file (S_IFREG|perm)
	// at path; EEXIST is fine. Only in the remount list (after
	// pivot_root), inside a tmpfs the child has mounted, which the
	// template cannot hold (see treeBuilder.bindUnderTmpfs).
	mknod uint32
}

// rlimitOp is one prlimit64 call.
type rlimitOp struct {
	resource int
	lim      unix.Rlimit
}

// llRule is one Landlock path-beneath rule, opened by path in the child
// after pivot_root so that it names the sandbox's own tree.
type llRule struct {
	path *byte
	attr landlockPathBeneath
}

// landlockPathBeneath mirrors struct landlock_path_beneath_attr, which is
// packed: 8 bytes of access then a 4-byte fd.
type landlockPathBeneath struct {
	raw [12]byte
}

// plan is everything the child does between clone and execve, computed by
// the parent. The child performs only raw system calls over it.
type plan struct {
	cloneFlags uintptr
	syncFd     int     // child reads one byte: uid maps and cgroup are ready
	syncWrFd   int     // the parent's end, closed in the child so EOF means the parent died
	cgTasks    []int   // cgroup v1 tasks files the child first writes "0" to, moving itself in (else the parent adds it)
	cgSelf     [1]byte // "0": the writing thread
	errFd      int     // child writes a childError on failure (close-on-exec)
	stdio      [3]int
	ctty       bool // fd 0 becomes the controlling terminal (Config.ControllingTerminal)

	ops      []op
	newRoot  *byte
	dot      *byte
	slash    *byte
	hostname []byte
	remount  []op // after pivot_root (read-only remounts, /proc)

	rlimits    []rlimitOp
	lastCap    uintptr
	setgroups  bool
	uid, gid   uintptr
	capHdr     unix.CapUserHeader
	capData    [2]unix.CapUserData // permitted, effective, inheritable: keepCaps (zero for a workload)
	keepCaps   uint64              // capabilities kept through execve (ambient): the agent's, see AgentCaps, and RootCaps
	securebits uintptr             // secureNoRoot, or secureRoot for a root workload

	llAttr    []byte // struct landlock_ruleset_attr, sized for the ABI; nil = no Landlock
	llRules   []llRule
	seccomp   *unix.SockFprog
	workdir   *byte
	argv0     []*byte // candidate executables, tried in order
	argv      []*byte // nil-terminated
	envv      []*byte // nil-terminated
	unshareCg bool
	noPdeath  bool // long-lived sandboxes survive a restart of the server

	nsLimits []*byte  // /proc/sys/user/max_*_namespaces files the child sets to 0 (seccomp.Guards.Clone3)
	zero     [1]byte  // "0"
	leafFd   int      // >= 4: the workload's cgroup leaf, handed to the init as fd 3 (cgroups.V2Split); else -1
	ifreqLo  [40]byte // struct ifreq{"lo", IFF_UP} to bring loopback up

	oomPath  *byte  // "/proc/self/oom_score_adj"
	oomScore []byte // the value written there

	listenAddrs []unix.RawSockaddrInet4 // listeners to open inside and pass to the parent
	listenFd    int                     // child's end of the socketpair they go through
	msg         *unix.Msghdr            // one byte plus an SCM_RIGHTS message
	cmsg        []byte
	cmsgData    int // offset of the fds in cmsg
	iovByte     [1]byte
	iov         unix.Iovec
}

// Stages reported by the child with its errno. Values >= stageOp index p.ops;
// values >= stageRemount index p.remount.
const (
	stageSync uint32 = iota + 1
	stageCgroupNS
	stageSetsid
	stagePrivate
	stagePivot
	stageHostname
	stageRlimit
	stageSecurebits
	stageCapBound
	stageSetgroups
	stageSetgid
	stageSetuid
	stageCapset
	stageAmbient
	stagePdeath
	stageNoNewPrivs
	stageLandlock
	stageDup
	stageCloseRange
	stageChdir
	stageSeccomp
	stageExec
	stageLoopback
	stageListen
	stageOOMScore
	stageAmbientRaise
	stageCgroupJoin
	stageCtty
	stageNSLimits
	stageLeafFd
	stageOp      uint32 = 1000
	stageRemount uint32 = 2000
)

// childError is what the child writes to errFd before exiting.
type childError struct {
	stage uint32
	errno uint32
}

// Securebits that make uid 0 inside the sandbox powerless across execve.
const secureNoRoot = 1<<0 | 1<<1 | 1<<2 | 1<<3 | 1<<4 | 1<<5 // NOROOT, NO_SETUID_FIXUP, KEEP_CAPS (+ _LOCKED)

// secureRoot is for sandboxes whose workload is root (policy.User.Root):
// uid 0 still gains nothing by execve (NOROOT, locked), its capabilities
// come as ambient ones, and a switch away from uid 0 drops them as on any
// Linux system (no NO_SETUID_FIXUP: apt checks that its _apt helpers cannot
// become root again). KEEP_CAPS, unlocked and cleared by execve, lets the
// launcher keep the agent's permitted set through its switch to AgentUID;
// the agent sets it again to start root workloads (Go's AmbientCaps).
const secureRoot = 1<<0 | 1<<1 | 1<<4

// forkChild clones into new namespaces and, in the child, performs the plan
// and execs. It returns the child's pid in the parent. It must not be split:
// the child runs on a copy of this frame with the stack guard poisoned, so it
// calls nothing but raw system calls.
//
//go:noinline
//go:norace
//go:nocheckptr
func forkChild(p *plan) (pid int, err syscall.Errno) {
	var (
		r1      uintptr
		e1      syscall.Errno
		stage   uint32
		b       [1]byte
		fd      uintptr
		ruleset uintptr
	)
	runtimeBeforeFork()
	r1, _, e1 = syscall.RawSyscall6(syscall.SYS_CLONE, p.cloneFlags|uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e1 != 0 || r1 != 0 {
		runtimeAfterFork()
		return int(r1), e1
	}

	// ---- child: no allocation, no stack growth, raw system calls only ----
	runtimeAfterForkInChild()

	syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(p.syncWrFd), 0, 0)
	// Join the sandbox's cgroups (v1) while still one thread, before
	// anything else and in parallel with the parent's uid maps. Moving
	// oneself skips the global threadgroup lock a move by pid takes.
	for i := 0; i < len(p.cgTasks); i++ {
		if _, _, e1 = syscall.RawSyscall(syscall.SYS_WRITE, uintptr(p.cgTasks[i]), uintptr(unsafe.Pointer(&p.cgSelf[0])), 1); e1 != 0 {
			stage = stageCgroupJoin
			goto fail
		}
		syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(p.cgTasks[i]), 0, 0)
	}
	// Wait until the parent has written our uid/gid maps (and, on cgroup
	// v2, put us in our cgroup). EOF means the parent is gone.
	r1, _, e1 = syscall.RawSyscall(syscall.SYS_READ, uintptr(p.syncFd), uintptr(unsafe.Pointer(&b[0])), 1)
	if e1 != 0 || r1 != 1 {
		stage = stageSync
		goto fail
	}
	syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(p.syncFd), 0, 0)
	// Under host memory pressure the kernel should kill sandboxes before
	// the server or the host's daemons: raise our OOM score (raising needs
	// no privilege; children inherit it).
	fd, _, e1 = syscall.RawSyscall6(syscall.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(p.oomPath)), syscall.O_WRONLY|syscall.O_CLOEXEC, 0, 0, 0)
	if e1 == 0 {
		_, _, e1 = syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p.oomScore[0])), uintptr(len(p.oomScore)))
		syscall.RawSyscall(syscall.SYS_CLOSE, fd, 0, 0)
	}
	if e1 != 0 {
		stage = stageOOMScore
		goto fail
	}
	if p.unshareCg {
		if _, _, e1 = syscall.RawSyscall(syscall.SYS_UNSHARE, syscall.CLONE_NEWCGROUP, 0, 0); e1 != 0 {
			stage = stageCgroupNS
			goto fail
		}
	}
	// From here on no namespace can be made in the sandbox's user
	// namespace (its cgroup namespace is the last), whatever
	// the system call (clone3's flags are out of seccomp's reach). The
	// limits are the user namespace's own; only CAP_SYS_RESOURCE in it,
	// which nothing in the sandbox keeps, could raise them.
	for i := 0; i < len(p.nsLimits); i++ {
		fd, _, e1 = syscall.RawSyscall6(syscall.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(p.nsLimits[i])), syscall.O_WRONLY|syscall.O_CLOEXEC, 0, 0, 0)
		if e1 == 0 {
			_, _, e1 = syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p.zero[0])), 1)
			syscall.RawSyscall(syscall.SYS_CLOSE, fd, 0, 0)
		}
		if e1 != 0 {
			stage = stageNSLimits
			goto fail
		}
	}
	if _, _, e1 = syscall.RawSyscall(syscall.SYS_SETSID, 0, 0, 0); e1 != 0 {
		stage = stageSetsid
		goto fail
	}

	// Mount tree: nothing we do propagates back to the host.
	if _, _, e1 = syscall.RawSyscall6(syscall.SYS_MOUNT, 0, uintptr(unsafe.Pointer(p.slash)), 0, syscall.MS_REC|syscall.MS_PRIVATE, 0, 0); e1 != 0 {
		stage = stagePrivate
		goto fail
	}
	for i := 0; i < len(p.ops); i++ {
		o := &p.ops[i]
		_, _, e1 = syscall.RawSyscall6(syscall.SYS_MOUNT, uintptr(unsafe.Pointer(o.src)), uintptr(unsafe.Pointer(o.path)),
			uintptr(unsafe.Pointer(o.fstype)), o.flags, uintptr(unsafe.Pointer(o.data)), 0)
		if e1 != 0 {
			stage = stageOp + uint32(i)
			goto fail
		}
	}

	// pivot_root into the new tree and detach the old root entirely.
	if _, _, e1 = syscall.RawSyscall(syscall.SYS_CHDIR, uintptr(unsafe.Pointer(p.newRoot)), 0, 0); e1 != 0 {
		stage = stagePivot
		goto fail
	}
	if _, _, e1 = syscall.RawSyscall(syscall.SYS_PIVOT_ROOT, uintptr(unsafe.Pointer(p.dot)), uintptr(unsafe.Pointer(p.dot)), 0); e1 != 0 {
		stage = stagePivot
		goto fail
	}
	if _, _, e1 = syscall.RawSyscall(syscall.SYS_UMOUNT2, uintptr(unsafe.Pointer(p.dot)), syscall.MNT_DETACH, 0); e1 != 0 {
		stage = stagePivot
		goto fail
	}
	if _, _, e1 = syscall.RawSyscall(syscall.SYS_CHDIR, uintptr(unsafe.Pointer(p.slash)), 0, 0); e1 != 0 {
		stage = stagePivot
		goto fail
	}
	for i := 0; i < len(p.remount); i++ {
		o := &p.remount[i]
		switch {
		case o.mknod != 0:
			// The new inode's owner must be mapped in the tmpfs's user
			// namespace: act as its root (as root the child is still
			// host root, which no sandbox maps; unprivileged, this fails
			// harmlessly and the caller's own mapped ids stay).
			syscall.RawSyscall(syscall.SYS_SETFSUID, 0, 0, 0)
			syscall.RawSyscall(syscall.SYS_SETFSGID, 0, 0, 0)
			if o.mknod&syscall.S_IFMT == syscall.S_IFDIR {
				_, _, e1 = syscall.RawSyscall(syscall.SYS_MKDIRAT, atFDCWD, uintptr(unsafe.Pointer(o.path)), uintptr(o.mknod&0o7777))
			} else {
				_, _, e1 = syscall.RawSyscall6(syscall.SYS_MKNODAT, atFDCWD, uintptr(unsafe.Pointer(o.path)), uintptr(o.mknod), 0, 0, 0)
			}
			if e1 == syscall.EEXIST {
				e1 = 0
			}
		default:
			_, _, e1 = syscall.RawSyscall6(syscall.SYS_MOUNT, uintptr(unsafe.Pointer(o.src)), uintptr(unsafe.Pointer(o.path)),
				uintptr(unsafe.Pointer(o.fstype)), o.flags, uintptr(unsafe.Pointer(o.data)), 0)
		}
		if e1 != 0 {
			stage = stageRemount + uint32(i)
			goto fail
		}
	}
	// Loopback up: the namespace stays empty, but programs may talk to
	// themselves (and to the agent's proxy) over 127.0.0.1.
	fd, _, e1 = syscall.RawSyscall(syscall.SYS_SOCKET, syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if e1 != 0 {
		stage = stageLoopback
		goto fail
	}
	_, _, e1 = syscall.RawSyscall(syscall.SYS_IOCTL, fd, syscall.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&p.ifreqLo[0])))
	syscall.RawSyscall(syscall.SYS_CLOSE, fd, 0, 0)
	if e1 != 0 {
		stage = stageLoopback
		goto fail
	}
	// Listeners for the host (the egress proxy): bound here, inside the new
	// network namespace, and passed to the parent over a socketpair, so it
	// works without root (a non-root parent may not setns into the netns).
	if len(p.listenAddrs) > 0 {
		for i := 0; i < len(p.listenAddrs); i++ {
			fd, _, e1 = syscall.RawSyscall(syscall.SYS_SOCKET, syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if e1 == 0 {
				_, _, e1 = syscall.RawSyscall(syscall.SYS_BIND, fd, uintptr(unsafe.Pointer(&p.listenAddrs[i])), unsafe.Sizeof(p.listenAddrs[i]))
			}
			if e1 == 0 {
				_, _, e1 = syscall.RawSyscall(syscall.SYS_LISTEN, fd, 128, 0)
			}
			if e1 != 0 {
				stage = stageListen
				goto fail
			}
			*(*int32)(unsafe.Pointer(&p.cmsg[p.cmsgData+4*i])) = int32(fd)
		}
		if _, _, e1 = syscall.RawSyscall(syscall.SYS_SENDMSG, uintptr(p.listenFd), uintptr(unsafe.Pointer(p.msg)), 0); e1 != 0 {
			stage = stageListen
			goto fail
		}
		for i := 0; i < len(p.listenAddrs); i++ {
			syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(*(*int32)(unsafe.Pointer(&p.cmsg[p.cmsgData+4*i]))), 0, 0)
		}
		syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(p.listenFd), 0, 0)
	}
	if len(p.hostname) > 0 {
		if _, _, e1 = syscall.RawSyscall(syscall.SYS_SETHOSTNAME, uintptr(unsafe.Pointer(&p.hostname[0])), uintptr(len(p.hostname)), 0); e1 != 0 {
			stage = stageHostname
			goto fail
		}
	}

	// Privileges: lock uid 0 out of capabilities, empty the bounding set,
	// become the sandbox user, then clear every remaining set.
	if _, _, e1 = syscall.RawSyscall(syscall.SYS_PRCTL, unix.PR_SET_SECUREBITS, p.securebits, 0); e1 != 0 {
		stage = stageSecurebits
		goto fail
	}
	for c := uintptr(0); c <= p.lastCap; c++ {
		if p.keepCaps&(1<<c) != 0 {
			continue // an agent capability: it must stay raisable
		}
		if _, _, e1 = syscall.RawSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); e1 != 0 && e1 != syscall.EINVAL {
			stage = stageCapBound
			goto fail
		}
	}
	if p.setgroups {
		if _, _, e1 = syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); e1 != 0 {
			stage = stageSetgroups
			goto fail
		}
	}
	if _, _, e1 = syscall.RawSyscall(syscall.SYS_SETRESGID, p.gid, p.gid, p.gid); e1 != 0 {
		stage = stageSetgid
		goto fail
	}
	if _, _, e1 = syscall.RawSyscall(syscall.SYS_SETRESUID, p.uid, p.uid, p.uid); e1 != 0 {
		stage = stageSetuid
		goto fail
	}
	if _, _, e1 = syscall.RawSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&p.capHdr)), uintptr(unsafe.Pointer(&p.capData[0])), 0); e1 != 0 {
		stage = stageCapset
		goto fail
	}
	if _, _, e1 = syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); e1 != 0 {
		stage = stageAmbient
		goto fail
	}
	// The agent's few capabilities survive its execve as ambient ones.
	for c := uintptr(0); c < 64; c++ {
		if p.keepCaps&(1<<c) == 0 {
			continue
		}
		if _, _, e1 = syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, c, 0, 0, 0); e1 != 0 {
			stage = stageAmbientRaise
			goto fail
		}
	}
	// The parent-death signal is cleared by credential changes: set it now.
	if !p.noPdeath {
		if _, _, e1 = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0); e1 != 0 {
			stage = stagePdeath
			goto fail
		}
	}
	if _, _, e1 = syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); e1 != 0 {
		stage = stageNoNewPrivs
		goto fail
	}

	// Landlock: read-only everywhere but the writable trees.
	if len(p.llAttr) > 0 {
		ruleset, _, e1 = syscall.RawSyscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&p.llAttr[0])), uintptr(len(p.llAttr)), 0)
		if e1 != 0 {
			stage = stageLandlock
			goto fail
		}
		for i := 0; i < len(p.llRules); i++ {
			r := &p.llRules[i]
			fd, _, e1 = syscall.RawSyscall6(syscall.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(r.path)), unix.O_PATH|syscall.O_CLOEXEC, 0, 0, 0)
			if e1 == syscall.ENOENT {
				continue
			}
			if e1 != 0 {
				stage = stageLandlock
				goto fail
			}
			*(*int32)(unsafe.Pointer(&r.attr.raw[8])) = int32(fd)
			_, _, e1 = syscall.RawSyscall6(unix.SYS_LANDLOCK_ADD_RULE, ruleset, unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&r.attr.raw[0])), 0, 0, 0)
			syscall.RawSyscall(syscall.SYS_CLOSE, fd, 0, 0)
			if e1 != 0 {
				stage = stageLandlock
				goto fail
			}
		}
		if _, _, e1 = syscall.RawSyscall(unix.SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0, 0); e1 != 0 {
			stage = stageLandlock
			goto fail
		}
		syscall.RawSyscall(syscall.SYS_CLOSE, ruleset, 0, 0)
	}

	// Standard streams, then every other descriptor is closed on exec.
	// The parent made every stdio descriptor >= 3, so dup3 never aliases.
	for i := 0; i < 3; i++ {
		if _, _, e1 = syscall.RawSyscall(syscall.SYS_DUP3, uintptr(p.stdio[i]), uintptr(i), 0); e1 != 0 {
			stage = stageDup
			goto fail
		}
	}
	if p.ctty {
		if _, _, e1 = syscall.RawSyscall(syscall.SYS_IOCTL, 0, syscall.TIOCSCTTY, 0); e1 != 0 {
			stage = stageCtty
			goto fail
		}
	}
	if _, _, e1 = syscall.RawSyscall(unix.SYS_CLOSE_RANGE, 3, ^uintptr(0), unix.CLOSE_RANGE_CLOEXEC); e1 != 0 {
		stage = stageCloseRange
		goto fail
	}
	if p.leafFd >= 4 {
		if _, _, e1 = syscall.RawSyscall(syscall.SYS_DUP3, uintptr(p.leafFd), 3, 0); e1 != 0 {
			stage = stageLeafFd
			goto fail
		}
	}
	if _, _, e1 = syscall.RawSyscall(syscall.SYS_CHDIR, uintptr(unsafe.Pointer(p.workdir)), 0, 0); e1 != 0 {
		stage = stageChdir
		goto fail
	}

	// rlimits late: the child still holds the launcher's descriptors until
	// execve, so an early RLIMIT_NOFILE would break the opens above.
	for i := 0; i < len(p.rlimits); i++ {
		if _, _, e1 = syscall.RawSyscall6(unix.SYS_PRLIMIT64, 0, uintptr(p.rlimits[i].resource), uintptr(unsafe.Pointer(&p.rlimits[i].lim)), 0, 0, 0); e1 != 0 {
			stage = stageRlimit
			goto fail
		}
	}

	// seccomp last: from here on only execve and the error report run.
	if p.seccomp != nil {
		if _, _, e1 = syscall.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(p.seccomp))); e1 != 0 {
			stage = stageSeccomp
			goto fail
		}
	}
	for i := 0; i < len(p.argv0); i++ {
		_, _, e1 = syscall.RawSyscall(syscall.SYS_EXECVE, uintptr(unsafe.Pointer(p.argv0[i])),
			uintptr(unsafe.Pointer(&p.argv[0])), uintptr(unsafe.Pointer(&p.envv[0])))
		if e1 != syscall.ENOENT && e1 != syscall.ENOTDIR {
			break
		}
	}
	stage = stageExec

fail:
	{
		ce := childError{stage: stage, errno: uint32(e1)}
		syscall.RawSyscall(syscall.SYS_WRITE, uintptr(p.errFd), uintptr(unsafe.Pointer(&ce)), unsafe.Sizeof(ce))
		for {
			syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 127, 0, 0)
		}
	}
}

// atFDCWD is AT_FDCWD (-100) as a system-call argument.
const atFDCWD = ^uintptr(99)
