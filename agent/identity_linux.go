package agent

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// Linux capability numbers and prctl options used below.
const (
	capKill    = 5
	capSetgid  = 6
	capSetuid  = 7
	capLastMax = 63

	prSetDumpable  = 4
	prCapbsetDrop  = 24
	linuxCapV3     = 0x20080522
	sysSetfsuid    = syscall.SYS_SETFSUID
	sysSetfsgid    = syscall.SYS_SETFSGID
	sysCapset      = syscall.SYS_CAPSET
	sysCapget      = syscall.SYS_CAPGET
	sysPrctl       = syscall.SYS_PRCTL
	wantAgentCaps  = 1<<capKill | 1<<capSetgid | 1<<capSetuid
	capUserHeadLen = 2
)

// workloadCred is the identity of every process the agent starts, or nil
// when the agent runs as the workload's own user (unprivileged airlock).
var workloadCred *syscall.Credential

// workloadCaps are the ambient capabilities of every process the agent
// starts: the native runtime's RootCaps for a root workload ("--root-caps"),
// else none.
var workloadCaps []uintptr

// rootCapsArg finds "--root-caps=N,N,..." (capability numbers) in args.
func rootCapsArg(args []string) ([]uintptr, error) {
	for _, arg := range args {
		v, found := strings.CutPrefix(arg, "--root-caps=")
		if !found {
			continue
		}
		var caps []uintptr
		for _, f := range strings.Split(v, ",") {
			c, err := strconv.Atoi(f)
			if err != nil || c < 0 || c > capLastMax {
				return nil, fmt.Errorf("bad --root-caps %q", v)
			}
			caps = append(caps, uintptr(c))
		}
		return caps, nil
	}
	return nil, nil
}

// userArg finds "--user UID:GID" or "--user=UID:GID" in args.
func userArg(args []string) (uid, gid int, ok bool, err error) {
	for i, arg := range args {
		v, found := strings.CutPrefix(arg, "--user=")
		if !found && arg == "--user" && i+1 < len(args) {
			v, found = args[i+1], true
		}
		if !found {
			continue
		}
		u, g, cut := strings.Cut(v, ":")
		uid, err1 := strconv.Atoi(u)
		gid, err2 := strconv.Atoi(g)
		if !cut || err1 != nil || err2 != nil || uid < 0 || gid < 0 {
			return 0, 0, false, fmt.Errorf("bad --user %q (want UID:GID)", v)
		}
		return uid, gid, true, nil
	}
	return 0, 0, false, nil
}

// secureIdentity puts the agent out of the workload's reach. Always: the
// agent is not dumpable, so no process of the workload can trace it or open
// its /proc/1/mem, fd, environ (that needs CAP_SYS_PTRACE, which the
// workload never has). When the agent runs as a uid of its own (the native
// runtime's AgentUID) and the workload's user is given, it also empties its
// capability bounding set, keeps only kill, setuid and setgid (to start and
// signal workload processes), and does its file work with the workload's
// fsuid/fsgid so that the files it writes belong to the workload user. For
// a root workload ("--root-caps") it keeps those capabilities in its
// bounding and permitted sets (not effective) and gives them to every
// process it starts as ambient capabilities.
func secureIdentity(args []string) error {
	if _, _, e := syscall.RawSyscall(sysPrctl, prSetDumpable, 0, 0); e != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", e)
	}
	if workloadCred != nil {
		return nil // set by mountTmpfs (becomeRootAgent, under gVisor)
	}
	uid, gid, ok, err := userArg(args)
	if err != nil {
		return err
	}
	if !ok || (uid == os.Getuid() && gid == os.Getgid()) {
		return nil // the agent shares the workload's uid: nothing to drop to
	}
	if uid == os.Geteuid() && gid == os.Getegid() {
		// Under gVisor (becomeAgent): the agent's real and saved ids are
		// its own, its effective ids the workload's (gVisor has no
		// setfsuid), its capabilities already reduced to kill, setuid and
		// setgid. What it starts becomes uid:gid entirely.
		workloadCred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
		return nil
	}
	rootCaps, keep, err := boundToRootCaps(args)
	if err != nil {
		return err
	}
	syscall.AllThreadsSyscall(sysSetfsgid, uintptr(gid), 0, 0)
	syscall.AllThreadsSyscall(sysSetfsuid, uintptr(uid), 0, 0)
	hdr := [capUserHeadLen]uint32{linuxCapV3, 0}
	var data [2]struct{ effective, permitted, inheritable uint32 }
	data[0].effective, data[0].permitted = wantAgentCaps, wantAgentCaps|uint32(keep)
	data[1].permitted = uint32(keep >> 32)
	if _, _, e := syscall.AllThreadsSyscall(sysCapset, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data)), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	// setfsuid answers the previous value: check that it took.
	if r, _, _ := syscall.RawSyscall(sysSetfsuid, ^uintptr(0), 0, 0); int(r) != uid {
		return fmt.Errorf("setfsuid(%d) did not take (fsuid %d)", uid, r)
	}
	workloadCred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	workloadCaps = rootCaps
	return nil
}

// boundToRootCaps parses the root workload's capabilities (--root-caps),
// returns them and their mask, and drops every other one from the bounding set of all the agent's threads
// (capabilities are per thread; threads created later inherit them).
func boundToRootCaps(args []string) (rootCaps []uintptr, keep uint64, err error) {
	if rootCaps, err = rootCapsArg(args); err != nil {
		return nil, 0, err
	}
	// keep is what the workload gets: it stays in the bounding and
	// permitted sets.
	for _, c := range rootCaps {
		keep |= 1 << c
	}
	for c := uintptr(0); c <= capLastMax; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(sysPrctl, prCapbsetDrop, c, 0); e != 0 && e != syscall.EINVAL {
			return nil, 0, fmt.Errorf("drop capability %d from the bounding set: %w", c, e)
		}
	}
	return rootCaps, keep, nil
}
