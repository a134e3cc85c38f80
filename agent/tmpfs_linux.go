package agent

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// tmpfsFlags are the mount flags "--tmpfs" options may name.
var tmpfsFlags = map[string]uintptr{"nosuid": unix.MS_NOSUID, "nodev": unix.MS_NODEV, "noexec": unix.MS_NOEXEC, "ro": unix.MS_RDONLY}

// mountTmpfs mounts a tmpfs for every "--tmpfs=TARGET=OPT,OPT,..." in args
// (flags such as nosuid, and the filesystem's own key=value options such
// as size and nr_inodes), then becomes the workload's user ("--user
// UID:GID") with no capabilities at all. The gvisor runtime asks for it:
// runsc passes only mode, size, uid and gid of an OCI tmpfs mount to
// gVisor, whose tmpfs has nr_inodes too, so the agent starts as root
// inside gVisor with CAP_SYS_ADMIN, mounts /workspace and /tmp itself with
// the policy's inode limit, and drops everything before it serves. Without
// "--tmpfs" it does nothing. Any failure is fatal: the sandbox must not
// run without its limits or with the agent privileged.
func mountTmpfs(args []string) error {
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
	if n == 0 {
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
		return fmt.Errorf("--tmpfs needs --user with a non-root workload user to drop to (%v)", err)
	}
	return dropToUser(uid, gid)
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
