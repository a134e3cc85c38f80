//go:build linux && amd64

package main

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// inChild forks, makes one system call in the child, and returns the
// child's errno (nil when the call succeeded). Calls that would change the
// probe itself (unshare, chroot, setns, personality) run here, so their
// effect vanishes with the child.
func inChild(trap uintptr, args ...uintptr) error {
	var a [6]uintptr
	copy(a[:], args)
	pid, errno := rawFork(0, true, trap, a)
	if errno != 0 {
		return fmt.Errorf("fork for the check failed: %v", errno)
	}
	return waitChild(pid)
}

// forkWith makes a raw clone(flags|SIGCHLD); the child exits at once. It
// returns clone's errno, or nil when the child was created.
func forkWith(flags uintptr) error {
	pid, errno := rawFork(flags, false, 0, [6]uintptr{})
	if errno != 0 {
		return errno
	}
	if err := waitChild(pid); err != nil {
		return fmt.Errorf("child of clone(%#x): %v", flags, err)
	}
	return nil
}

// rawFork clones the calling thread into a new process with all signals
// blocked. The child runs no Go code beyond raw system calls: it optionally
// makes one call and exits with its errno. The parent gets the child's pid.
//
//go:norace
func rawFork(flags uintptr, call bool, trap uintptr, a [6]uintptr) (int, syscall.Errno) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, old unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^uint64(0)
	}
	const sigsetSize = 8
	if _, _, e := syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK,
		uintptr(unsafe.Pointer(&all)), uintptr(unsafe.Pointer(&old)), sigsetSize, 0, 0); e != 0 {
		return 0, e
	}
	pid, _, e := syscall.RawSyscall6(unix.SYS_CLONE, flags|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	if e == 0 && pid == 0 {
		// Child: only nosplit raw system calls from here on.
		code := uintptr(0)
		if call {
			_, _, ce := syscall.RawSyscall6(trap, a[0], a[1], a[2], a[3], a[4], a[5])
			code = uintptr(ce)
		}
		for {
			syscall.RawSyscall(unix.SYS_EXIT_GROUP, code, 0, 0)
		}
	}
	syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK,
		uintptr(unsafe.Pointer(&old)), 0, sigsetSize, 0, 0)
	return int(pid), e
}

// waitChild reaps a child made by rawFork and turns its exit code back
// into an errno.
func waitChild(pid int) error {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for child %d: %v", pid, err)
		}
		break
	}
	switch {
	case ws.Exited() && ws.ExitStatus() == 0:
		return nil
	case ws.Exited():
		return syscall.Errno(ws.ExitStatus())
	default:
		return fmt.Errorf("child %d ended with status %#x", pid, uint32(ws))
	}
}
