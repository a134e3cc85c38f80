package native

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The launcher is the real parent of a sandbox's init, so a thread of the
// init that calls ptrace(PTRACE_TRACEME) makes the launcher its tracer. A
// tracee's signals then stop it until the tracer acts, and a traced thread
// that exits stays a zombie until the tracer reaps it, holding the init's
// exit back (and the kernel's zap_pid_ns_processes with it). airlock never
// traces: every waiter here uses __WALL, treats a ptrace-stop of a sandbox
// task as hostile (the sandbox is killed) and reaps traced threads, so a
// deadline or a kill always ends in a reaped init.

// waitAll is waitid's __WALL: wait for clone children and traced threads too.
const waitAll = 0x40000000

// siginfo codes for SIGCHLD (CLD_*).
const (
	cldExited  = 1
	cldKilled  = 2
	cldDumped  = 3
	cldTrapped = 4
	cldStopped = 5
)

// ExitState is how a sandbox's init ended.
type ExitState struct {
	// Status is the wait status of the init.
	Status syscall.WaitStatus
	// Rusage is the resource usage of the init and its reaped descendants.
	Rusage unix.Rusage
	// Traced is set when a sandbox process made the launcher its tracer
	// (PTRACE_TRACEME) and was killed for it.
	Traced bool
}

// ErrTracedLauncher explains a sandbox killed because one of its processes
// asked to be traced by the launcher.
var ErrTracedLauncher = errors.New("a sandbox process called ptrace(PTRACE_TRACEME) with airlock's launcher as its parent; airlock never traces, so the sandbox was killed")

// childInfo is the SIGCHLD part of a siginfo_t.
type childInfo struct {
	signo  int32
	errno  int32
	code   int32
	_      int32
	pid    int32
	uid    uint32
	status int32
}

// waitid calls waitid(2) and decodes the child part of the siginfo.
func waitid(idtype, id, options int, ru *unix.Rusage) (childInfo, error) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(idtype, id, &info, options, ru)
		if err == unix.EINTR {
			continue
		}
		ci := *(*childInfo)(unsafe.Pointer(&info))
		return ci, err
	}
}

// waitStatus converts a CLD_* code and status to a wait(2) status word.
func (ci childInfo) waitStatus() syscall.WaitStatus {
	switch ci.code {
	case cldExited:
		return syscall.WaitStatus(ci.status&0xff) << 8
	case cldKilled:
		return syscall.WaitStatus(ci.status & 0x7f)
	case cldDumped:
		return syscall.WaitStatus(ci.status&0x7f | 0x80)
	default: // trapped or stopped
		return syscall.WaitStatus(0x7f | (ci.status&0xff)<<8)
	}
}

// stopped reports a ptrace-stop or group-stop.
func (ci childInfo) stopped() bool { return ci.code == cldTrapped || ci.code == cldStopped }

// live is every started, not yet reaped sandbox of this process, so that
// a SIGCHLD (a traced thread stopped or exited) can be answered.
var live struct {
	sync.Mutex
	once sync.Once
	m    map[*Sandbox]struct{}
}

func register(s *Sandbox) {
	live.once.Do(func() {
		live.m = map[*Sandbox]struct{}{}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGCHLD)
		go func() {
			for range ch {
				live.Lock()
				all := make([]*Sandbox, 0, len(live.m))
				for s := range live.m {
					all = append(all, s)
				}
				live.Unlock()
				for _, s := range all {
					s.reapTraced()
				}
			}
		}()
	})
	live.Lock()
	live.m[s] = struct{}{}
	live.Unlock()
}

func unregister(s *Sandbox) {
	live.Lock()
	delete(live.m, s)
	live.Unlock()
}

// reapTraced reaps the init's threads that made us their tracer: a stopped
// one gets the sandbox killed, an exited one is reaped so that the init's
// exit can be reported. Threads we do not trace answer ECHILD at once.
func (s *Sandbox) reapTraced() {
	dir := "/proc/" + strconv.Itoa(s.Pid) + "/task"
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, n := range names {
		tid, err := strconv.Atoi(n)
		if err != nil || tid == s.Pid {
			continue
		}
		ci, err := waitid(unix.P_PID, tid, unix.WEXITED|unix.WSTOPPED|unix.WNOHANG|waitAll, nil)
		if err == nil && ci.pid != 0 && ci.stopped() {
			s.killTraced()
		}
	}
}

// killTraced kills the sandbox because one of its tasks is stopped under
// our tracing.
func (s *Sandbox) killTraced() {
	s.mu.Lock()
	s.traced = true
	s.mu.Unlock()
	s.Kill()
}

// waitInit reaps the init through its pidfd. A ptrace-stop (the init made
// us its tracer) kills the sandbox and the wait goes on; after a kill the
// init's traced threads are reaped until the init is.
func (s *Sandbox) waitInit() (*ExitState, error) {
	var ru unix.Rusage
	for {
		ci, err := waitid(unix.P_PIDFD, s.pidfd, unix.WEXITED|waitAll, &ru)
		if err != nil {
			return nil, fmt.Errorf("wait for sandbox init %d: %w", s.Pid, err)
		}
		if ci.stopped() {
			s.killTraced()
			continue
		}
		s.mu.Lock()
		traced := s.traced
		s.mu.Unlock()
		return &ExitState{Status: ci.waitStatus(), Rusage: ru, Traced: traced}, nil
	}
}

// reapAfterKill keeps reaping traced threads of a killed sandbox until its
// init has been reaped, in case a SIGCHLD came before the kill took effect.
func (s *Sandbox) reapAfterKill() {
	d := 10 * time.Millisecond
	for {
		select {
		case <-s.waitDone:
			return
		case <-time.After(d):
		}
		s.reapTraced()
		d = min(2*d, time.Second)
	}
}
