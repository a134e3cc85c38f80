package agent

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tmpfsFlags are the mount flags "--tmpfs" options may name.
var tmpfsFlags = map[string]uintptr{"nosuid": unix.MS_NOSUID, "nodev": unix.MS_NODEV, "noexec": unix.MS_NOEXEC, "ro": unix.MS_RDONLY}

// mountTmpfs mounts a tmpfs for every "--tmpfs=TARGET=OPT,OPT,..." in args
// (flags such as nosuid, and the filesystem's own key=value options such
// as size and nr_inodes), binds /workspace at "--workspace-bind=DST", then
// becomes the workload's user ("--user
// UID:GID") with no capabilities at all. The gvisor runtime asks for it:
// runsc passes only mode, size, uid and gid of an OCI tmpfs mount to
// gVisor, whose tmpfs has nr_inodes too, so the agent starts as root
// inside gVisor with CAP_SYS_ADMIN, mounts /workspace and /tmp itself with
// the policy's inode limit, and drops everything before it serves. Without
// "--tmpfs" it does nothing. Any failure is fatal: the sandbox must not
// run without its limits or with the agent privileged.
func mountTmpfs(args []string) error {
	aid, withID, err := agentIDArg(args)
	if err != nil {
		return err
	}
	n := 0
	for _, arg := range args {
		v, ok := strings.CutPrefix(arg, "--tmpfs=")
		if !ok {
			continue
		}
		n++
		target, opts, ok := strings.Cut(v, "=")
		if !ok || !strings.HasPrefix(target, "/") {
			return fmt.Errorf("bad --tmpfs %q (want TARGET=OPTIONS)", v)
		}
		var flags uintptr
		var data []string
		for _, o := range strings.Split(opts, ",") {
			switch f, isFlag := tmpfsFlags[o]; {
			case isFlag:
				flags |= f
			case strings.Contains(o, "="):
				data = append(data, o)
			case o == "":
			default:
				return fmt.Errorf("--tmpfs %s: unknown option %q", target, o)
			}
		}
		if err := unix.Mount("tmpfs", target, "tmpfs", flags, strings.Join(data, ",")); err != nil {
			return fmt.Errorf("mount tmpfs at %s (%s): %w", target, opts, err)
		}
	}
	// "--workspace-bind=DST": /workspace mounted a second time at DST
	// (/home/<user>, a directory of the read-only root), with the mounts
	// under it, as the native runtime does after pivot_root.
	for _, arg := range args {
		dst, ok := strings.CutPrefix(arg, "--workspace-bind=")
		if !ok {
			continue
		}
		n++
		if !strings.HasPrefix(dst, "/") {
			return fmt.Errorf("bad --workspace-bind %q (want an absolute path)", dst)
		}
		if err := unix.Mount("/workspace", dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind /workspace at %s: %w", dst, err)
		}
	}
	if n == 0 && !withID {
		return nil
	}
	uid, gid, ok, err := userArg(args)
	if aid, root, rerr := rootAgentIDArg(args); err == nil && ok && uid == 0 && gid == 0 && (root || rerr != nil) {
		if rerr != nil {
			return rerr
		}
		return becomeRootAgent(aid, args) // a uid-0 workload: rootagent_linux.go
	}
	if err != nil || !ok || uid == 0 {
		return fmt.Errorf("--tmpfs and --agent-id need --user with a non-root workload user to drop to (%v)", err)
	}
	if withID {
		if aid == 0 || aid == uid || aid == gid {
			return fmt.Errorf("--agent-id %d must differ from root and from the workload's user %d:%d", aid, uid, gid)
		}
		return becomeAgent(aid, uid, gid)
	}
	return dropToUser(uid, gid)
}

// agentIDArg finds "--agent-id=N" in args: the uid and gid the agent takes
// after mounting its tmpfs (see becomeAgent).
func agentIDArg(args []string) (int, bool, error) {
	for _, arg := range args {
		if v, ok := strings.CutPrefix(arg, "--agent-id="); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return 0, false, fmt.Errorf("bad --agent-id %q", v)
			}
			return n, true, nil
		}
	}
	return 0, false, nil
}

// agentKeeps are the capabilities the agent keeps under gVisor, as on the
// native runtime: kill (to signal workload processes), setuid and setgid
// (to start them as the workload's user).
const agentKeeps = uint64(1<<capKill | 1<<capSetgid | 1<<capSetuid)

// agentPermits are agentKeeps and, with a workload cgroup inside gVisor
// (workloadGroup), CAP_DAC_OVERRIDE, in the permitted set of every thread
// and the effective set of the spawner's thread alone.
const agentPermits = agentKeeps | 1<<unix.CAP_DAC_OVERRIDE

// becomeAgent gives the agent an identity of its own inside gVisor, out
// of the workload's reach: real and saved uid and gid aid, effective uid
// and gid the workload's (gVisor has no setfsuid: files are created with
// the effective ids, so the files the agent writes belong to the
// workload's user), no supplementary groups, and only kill, setuid and
// setgid in its permitted and effective sets (bounding, inheritable and
// ambient empty).
//
// Why this holds: prlimit needs the caller's real uid to equal the
// target's real, effective and saved uids; kill needs the sender's real
// or effective uid to equal the target's real or saved uid; ptrace needs
// both and a dumpable target. The workload runs as uid:gid in every id
// with no capabilities, the agent's real and saved ids are aid, and the
// agent is not dumpable (secureIdentity). The processes the agent starts
// set all their ids to the workload's with CAP_SETUID before exec, which
// then clears every capability (no file capabilities, no ambient set).
func becomeAgent(aid, uid, gid int) error {
	permits := agentKeeps
	if theWorkload != nil && !theWorkload.native {
		permits = agentPermits
	}
	// The bounding set only limits what an exec may gain: emptied, it
	// leaves the agent's permitted set as it is, and the workload, which
	// inherits it, with nothing to gain.
	for c := uintptr(0); c <= capLastMax; c++ {
		if _, _, e := syscall.AllThreadsSyscall(sysPrctl, prCapbsetDrop, c, 0); e != 0 && e != syscall.EINVAL {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, e)
		}
	}
	// Keep the permitted set across the change from uid 0 (the effective
	// set is cleared regardless; capset below restores it).
	if _, _, e := syscall.AllThreadsSyscall(sysPrctl, unix.PR_SET_KEEPCAPS, 1, 0); e != 0 {
		return fmt.Errorf("prctl(PR_SET_KEEPCAPS): %w", e)
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(aid, gid, aid); err != nil {
		return fmt.Errorf("setresgid(%d, %d, %d): %w", aid, gid, aid, err)
	}
	if err := syscall.Setresuid(aid, uid, aid); err != nil {
		return fmt.Errorf("setresuid(%d, %d, %d): %w", aid, uid, aid, err)
	}
	if _, _, e := syscall.AllThreadsSyscall(sysPrctl, unix.PR_SET_KEEPCAPS, 0, 0); e != 0 {
		return fmt.Errorf("prctl(PR_SET_KEEPCAPS, 0): %w", e)
	}
	hdr := [capUserHeadLen]uint32{linuxCapV3, 0}
	var data [2]struct{ effective, permitted, inheritable uint32 }
	data[0].effective, data[0].permitted = uint32(agentKeeps), uint32(permits)
	if _, _, e := syscall.AllThreadsSyscall(sysCapset, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data)), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	ru, eu, su := unix.Getresuid()
	rg, eg, sg := unix.Getresgid()
	if ru != aid || eu != uid || su != aid || rg != aid || eg != gid || sg != aid {
		return fmt.Errorf("identity after the change: uids %d/%d/%d gids %d/%d/%d, want %d/%d/%d and %d/%d/%d", ru, eu, su, rg, eg, sg, aid, uid, aid, aid, gid, aid)
	}
	if gs, err := syscall.Getgroups(); err != nil || len(gs) > 0 {
		return fmt.Errorf("supplementary groups left: %v %v", gs, err)
	}
	return checkCaps(map[string]uint64{"CapInh:": 0, "CapPrm:": permits, "CapEff:": agentKeeps, "CapBnd:": 0, "CapAmb:": 0})
}

// checkCaps compares the capability sets in /proc/self/status with want.
func checkCaps(want map[string]uint64) error {
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("check capabilities: %w", err)
	}
	seen := 0
	for _, line := range strings.Split(string(st), "\n") {
		k, v, ok := strings.Cut(line, "\t")
		w, known := want[k]
		if !ok || !known {
			continue
		}
		seen++
		got, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil || got != w {
			return fmt.Errorf("capabilities: %s, want %016x", line, w)
		}
	}
	if seen != len(want) {
		return fmt.Errorf("capabilities: %d of %d sets found in /proc/self/status", seen, len(want))
	}
	return nil
}

// dropToUser empties the capability bounding set and becomes uid:gid (no
// supplementary groups) on every thread, which clears the permitted and
// effective capabilities; it then checks that none is left.
func dropToUser(uid, gid int) error {
	for c := uintptr(0); c <= capLastMax; c++ {
		if _, _, e := syscall.AllThreadsSyscall(sysPrctl, prCapbsetDrop, c, 0); e != 0 && e != syscall.EINVAL {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, e)
		}
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("setresgid(%d): %w", gid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresuid(%d): %w", uid, err)
	}
	if os.Getuid() != uid || os.Geteuid() != uid || os.Getgid() != gid || os.Getegid() != gid {
		return fmt.Errorf("identity after the drop: uid %d/%d gid %d/%d, want %d:%d", os.Getuid(), os.Geteuid(), os.Getgid(), os.Getegid(), uid, gid)
	}
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("check capabilities after the drop: %w", err)
	}
	for _, line := range strings.Split(string(st), "\n") {
		for _, k := range []string{"CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"} {
			if v, ok := strings.CutPrefix(line, k); ok && strings.Trim(strings.TrimSpace(v), "0") != "" {
				return fmt.Errorf("capabilities left after the drop: %s", line)
			}
		}
	}
	return nil
}
