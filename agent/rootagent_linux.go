package agent

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rootAgentIDArg finds "--root-agent-id=N" in args: under gVisor, the uid
// and gid the agent of a uid-0 workload (an image whose user is root, or
// "user": "root") takes after mounting its tmpfs (becomeRootAgent).
func rootAgentIDArg(args []string) (int, bool, error) {
	for _, arg := range args {
		if v, ok := strings.CutPrefix(arg, "--root-agent-id="); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return 0, false, fmt.Errorf("bad --root-agent-id %q", v)
			}
			return n, true, nil
		}
	}
	return 0, false, nil
}

// becomeRootAgent gives the agent of a uid-0 workload inside gVisor an
// identity the workload cannot reach: real and saved uid and gid aid,
// effective uid and gid 0 (gVisor has no setfsuid: the agent's files are
// then the workload's, root's), no supplementary groups, kill, setuid and
// setgid effective, and in its bounding and permitted sets only those and
// the root workload's capabilities ("--root-caps", the native runtime's
// RootCaps, which the processes it starts get as ambient capabilities;
// none for an image's root without "user": "root").
//
// Why the workload cannot reach it: it runs with all ids 0 and at most
// RootCaps (no kill, no sys_ptrace, no sys_resource); kill needs the
// sender's real or effective uid to equal the target's real or saved uid
// (aid), prlimit the caller's real uid to equal all of the target's, and
// ptrace both and a dumpable target (the agent is not dumpable); with
// CAP_SETUID it cannot take uid aid either (guardAgentID).
func becomeRootAgent(aid int, args []string) error {
	rootCaps, keep, err := boundToRootCaps(args)
	if err != nil {
		return err
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	// The effective uid stays 0, so the permitted set survives the change.
	if err := syscall.Setresgid(aid, 0, aid); err != nil {
		return fmt.Errorf("setresgid(%d, 0, %d): %w", aid, aid, err)
	}
	if err := syscall.Setresuid(aid, 0, aid); err != nil {
		return fmt.Errorf("setresuid(%d, 0, %d): %w", aid, aid, err)
	}
	// With the workload in a cgroup of its own (theWorkload), the spawner
	// thread raises dac_override to clone into it (workloadGroup.join): it
	// stays permitted, as for a workload user's agent.
	permits := uint64(wantAgentCaps) | keep
	if theWorkload != nil && !theWorkload.native {
		permits |= 1 << unix.CAP_DAC_OVERRIDE
	}
	hdr := [capUserHeadLen]uint32{linuxCapV3, 0}
	var data [2]struct{ effective, permitted, inheritable uint32 }
	data[0].effective, data[0].permitted = wantAgentCaps, uint32(permits)
	data[1].permitted = uint32(keep >> 32)
	if _, _, e := syscall.AllThreadsSyscall(sysCapset, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data)), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	ru, eu, su := unix.Getresuid()
	rg, eg, sg := unix.Getresgid()
	if ru != aid || eu != 0 || su != aid || rg != aid || eg != 0 || sg != aid {
		return fmt.Errorf("identity after the change: uids %d/%d/%d gids %d/%d/%d, want %d/0/%d", ru, eu, su, rg, eg, sg, aid, aid)
	}
	if gs, err := syscall.Getgroups(); err != nil || len(gs) > 0 {
		return fmt.Errorf("supplementary groups left: %v %v", gs, err)
	}
	if err := checkCaps(map[string]uint64{"CapPrm:": permits, "CapEff:": wantAgentCaps, "CapBnd:": keep, "CapAmb:": 0}); err != nil {
		return err
	}
	if len(rootCaps) > 0 {
		if err := guardAgentID(aid); err != nil { // CAP_SETUID must not reach the agent's uid
			return err
		}
	}
	workloadCred = &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}}
	workloadCaps = rootCaps
	return nil
}
