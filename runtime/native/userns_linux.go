package native

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/runtime/native/idrange"
)

// DefaultUIDBase is the first host uid of the first range that sandbox
// uids 0-65535 map to when airlock runs as root; every sandbox leases a
// range of its own (package idrange). AIRLOCK_UID_BASE overrides it.
const DefaultUIDBase = idrange.DefaultFirst

// idMap is how sandbox ids map onto host ids.
type idMap struct {
	uidMap, gidMap string
	setgroups      bool // setgroups may be called (only when airlock is root)
	hostUID        int  // host uid of the sandbox user
	hostGID        int
	owner          int // host uid that owns the user namespace; -1: the caller
	desc           string
}

// mapping decides the uid/gid maps for a sandbox user (uid, gid inside).
// As root, sandbox ids 0-65535 map to the range base..base+65535 that the
// caller leased (base 0: mapping leases one for the sandbox's life and
// returns it; a host workspace already owned by an airlock range asks for
// that range). Otherwise the caller's own uid and gid become the sandbox
// user (unprivileged user namespaces). Host root is never mapped.
func mapping(base, uid, gid int, workspace string) (idMap, *idrange.Lease, error) {
	if os.Geteuid() != 0 {
		u, g := os.Geteuid(), os.Getegid()
		return idMap{
			uidMap:  fmt.Sprintf("%d %d 1\n", uid, u),
			gidMap:  fmt.Sprintf("%d %d 1\n", gid, g),
			hostUID: u,
			hostGID: g,
			owner:   -1,
			desc:    fmt.Sprintf("sandbox %d -> host %d (unprivileged: the caller's own uid, shared with the caller's other processes and sandboxes)", uid, u),
		}, nil, nil
	}
	var lease *idrange.Lease
	if base == 0 {
		pool, err := idrange.Default()
		if err != nil {
			return idMap{}, nil, err
		}
		want := workspaceRange(pool, workspace, uid)
		lease, err = pool.Acquire(os.Getpid(), want, nil)
		if want != 0 && errors.Is(err, idrange.ErrInUse) {
			return idMap{}, nil, fmt.Errorf("workspace %s belongs to host ids %d-%d, which a live sandbox holds (one sandbox per workspace at a time): %w",
				workspace, want, want+idrange.Size-1, err)
		}
		if err != nil {
			return idMap{}, nil, fmt.Errorf("lease a host uid range: %w", err)
		}
		base = lease.Base
	}
	return idMap{
		uidMap:    fmt.Sprintf("0 %d %d\n", base, idrange.Size),
		gidMap:    fmt.Sprintf("0 %d %d\n", base, idrange.Size),
		setgroups: true,
		hostUID:   base + uid,
		hostGID:   base + gid,
		owner:     base,
		desc:      fmt.Sprintf("sandbox 0-%d -> host %d-%d (a range of its own; user namespace owned by host uid %d)", idrange.Size-1, base, base+idrange.Size-1, base),
	}, lease, nil
}

// workspaceRange returns the range base owning an existing host workspace
// (so that a later run reuses the ids its files belong to), or 0.
func workspaceRange(pool idrange.Pool, dir string, uid int) int {
	if dir == "" {
		return 0
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return 0
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) < pool.First+uid || (int(st.Uid)-uid-pool.First)%idrange.Size != 0 {
		return 0
	}
	return int(st.Uid) - uid
}

// write installs the maps for the child pid.
func (m idMap) write(pid int) error {
	dir := "/proc/" + strconv.Itoa(pid)
	if !m.setgroups {
		if err := os.WriteFile(dir+"/setgroups", []byte("deny"), 0); err != nil {
			return fmt.Errorf("write setgroups: %w", err)
		}
	}
	if err := os.WriteFile(dir+"/gid_map", []byte(m.gidMap), 0); err != nil {
		return fmt.Errorf("write gid_map: %w", err)
	}
	if err := os.WriteFile(dir+"/uid_map", []byte(m.uidMap), 0); err != nil {
		return fmt.Errorf("write uid_map: %w", err)
	}
	return nil
}

// forkAs runs forkChild with the calling thread's effective uid set to
// m.owner, so that the sandbox's user namespace is owned by its own range:
// the kernel charges per-user counts of everything inside (inotify
// instances, user namespaces, message queues, pending signals) to the
// namespace's owner at the host level, and with root as the owner every
// sandbox would share root's counts with each other and with the host.
// The filesystem uid stays 0, so the child reaches the root-owned staging
// directory as before; credentials are per thread, so only this locked
// thread changes, and it is restored before it is unlocked.
func forkAs(m idMap, pl *plan) (int, syscall.Errno) {
	if m.owner < 0 {
		return forkChild(pl)
	}
	runtime.LockOSThread()
	// A change of effective uid resets the process's dumpable flag and
	// this thread's parent-death signal: both are put back afterwards.
	dumpable, _, _ := syscall.RawSyscall(syscall.SYS_PRCTL, unix.PR_GET_DUMPABLE, 0, 0)
	var pdeath int32
	syscall.RawSyscall(syscall.SYS_PRCTL, unix.PR_GET_PDEATHSIG, uintptr(unsafe.Pointer(&pdeath)), 0)
	keep := ^uintptr(0) // -1: leave unchanged
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, uintptr(m.owner), keep); e != 0 {
		runtime.UnlockOSThread()
		return 0, e
	}
	syscall.RawSyscall(syscall.SYS_SETFSUID, 0, 0, 0) // allowed: 0 is the real uid
	pid, errno := forkChild(pl)
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, 0, keep); e != 0 {
		// Cannot happen (0 is the real and saved uid); never run Go code
		// on a thread with the wrong identity.
		panic(errors.New("native: restore effective uid 0: " + e.Error()))
	}
	syscall.RawSyscall(syscall.SYS_PRCTL, unix.PR_SET_DUMPABLE, dumpable, 0)
	syscall.RawSyscall(syscall.SYS_PRCTL, unix.PR_SET_PDEATHSIG, uintptr(pdeath), 0)
	runtime.UnlockOSThread()
	return pid, errno
}

// keepLease ties a range that Start leased to the started sandbox: it is
// handed to the init, so that the range is free the moment the init is
// reaped (and stays taken if the sandbox outlives this process), and the
// lease file is removed once Wait has returned. It reports whether the
// lease is taken care of.
func keepLease(s *Sandbox, lease *idrange.Lease, _ bool) bool {
	if lease == nil {
		return true
	}
	_ = lease.SetHolder(s.Pid) // on failure this process stays the holder: the range is freed late, never shared
	go func() {
		<-s.Done()
		lease.Release()
	}()
	return true
}
