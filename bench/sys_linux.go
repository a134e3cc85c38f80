package bench

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// nsThread is an OS thread in a private mount namespace from which commands
// are started, so they inherit that namespace without an extra exec of
// nsenter(1) or unshare(1) in the timed path.
type nsThread struct {
	reqs chan func()
}

// newNSThread starts a goroutine locked to a thread that unshares its mount
// namespace, makes every mount private and mounts an empty tmpfs over hide.
// The thread never returns to the Go scheduler: when close is called the
// goroutine ends while still locked and the runtime discards the thread.
// The main thread is never used, because /proc/self describes it.
func newNSThread(hide string) (*nsThread, error) {
	t := &nsThread{reqs: make(chan func())}
	ready := make(chan error, 1)
	go t.serve(hide, ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return t, nil
}

// serve sets up the namespace on the current thread and runs requests.
func (t *nsThread) serve(hide string, ready chan<- error) {
	runtime.LockOSThread()
	if syscall.Gettid() == syscall.Getpid() {
		// On the main thread. Keep it locked until a new goroutine has
		// locked another thread, so the new one cannot land here too.
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(locked)
			t.setup(hide, ready)
		}()
		<-locked
		runtime.UnlockOSThread()
		return
	}
	t.setup(hide, ready)
}

// setup runs on a locked thread that is not the main thread. It never
// unlocks: the thread's filesystem view is not the process's any more.
func (t *nsThread) setup(hide string, ready chan<- error) {
	if err := syscall.Unshare(syscall.CLONE_NEWNS | syscall.CLONE_FS); err != nil {
		ready <- fmt.Errorf("unshare mount namespace: %w", err)
		return
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		ready <- fmt.Errorf("make mounts private: %w", err)
		return
	}
	if err := syscall.Mount("tmpfs", hide, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "mode=755"); err != nil {
		ready <- fmt.Errorf("mount tmpfs over %s: %w", hide, err)
		return
	}
	ready <- nil
	for f := range t.reqs {
		f()
	}
}

// start starts cmd from the namespace thread.
func (t *nsThread) start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	t.reqs <- func() { errc <- cmd.Start() }
	return <-errc
}

// close ends the thread.
func (t *nsThread) close() { close(t.reqs) }

// Filesystem magic numbers from statfs(2).
const (
	cgroup2Magic = 0x63677270
)

// detectHybrid reports whether /sys/fs/cgroup/unified is a cgroup2 mount
// with controllers while /sys/fs/cgroup itself is not cgroup2: the layout
// crun 1.8 refuses.
func detectHybrid() bool {
	var root, uni syscall.Statfs_t
	if syscall.Statfs("/sys/fs/cgroup", &root) != nil || root.Type == cgroup2Magic {
		return false
	}
	if syscall.Statfs("/sys/fs/cgroup/unified", &uni) != nil || uni.Type != cgroup2Magic {
		return false
	}
	b, err := os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")
	return err == nil && strings.TrimSpace(string(b)) != ""
}

// unmountUnder detaches every mount whose mount point is dir or below it,
// deepest first. runsc leaves a bind mount of its empty network namespace
// (null-netns) in its state directory, which would keep the directory from
// being removed.
func unmountUnder(dir string) {
	// Read this thread's view, which is the process's: only an nsThread
	// differs, and it is locked to its own goroutine.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	data, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}

// unescapeMountinfo decodes the \ooo octal escapes of /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// kernelRelease returns uname -r.
func kernelRelease() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return "unknown"
	}
	var b []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// cgroupLayout describes the host's cgroup layout.
func cgroupLayout() string {
	var st syscall.Statfs_t
	if syscall.Statfs("/sys/fs/cgroup", &st) != nil {
		return "none"
	}
	if st.Type == cgroup2Magic {
		return "v2"
	}
	if hybridCgroups() {
		return "v1 + cgroup2 at /sys/fs/cgroup/unified (hybrid)"
	}
	return "v1"
}

// kcmpVM is kcmp(2)'s KCMP_VM: do two processes share one address space?
const kcmpVM = 1

// sameMM reports whether processes a and b share one address space (as
// gVisor's systrap stubs do, clone(CLONE_VM) without CLONE_THREAD): each
// then reports the whole space's PSS, which must be counted once.
func sameMM(a, b int) bool {
	r, _, e := syscall.Syscall6(unix.SYS_KCMP, uintptr(a), uintptr(b), kcmpVM, 0, 0, 0)
	return e == 0 && r == 0
}
