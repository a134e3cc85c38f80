package agent

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Pseudo-terminals for processes started with a Pty. The terminal comes
// from the sandbox's own devpts (/dev/ptmx); the agent keeps a duplicate
// of each master, by pid, to resize it.

// ptyMasters maps a pid to a duplicate of its terminal's master.
var ptyMasters sync.Map // int → *os.File

// openPty opens a new terminal pair of the given size.
func openPty(size PtySize) (master, slave *os.File, err error) {
	if err := size.valid(); err != nil {
		return nil, nil, err
	}
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening a pseudo-terminal: %w", err)
	}
	var unlock int32
	var n uint32
	if err := ioctl(m, syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("unlocking the pseudo-terminal: %w", err)
	}
	if err := ioctl(m, syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("naming the pseudo-terminal: %w", err)
	}
	// The slave becomes the child's stdio, so it must stay blocking:
	// os.OpenFile would make it non-blocking for the agent's poller, and
	// the child's writes would fail with EAGAIN whenever the terminal's
	// buffer is full. os.NewFile leaves a blocking descriptor blocking.
	sfd, err := syscall.Open(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("opening the pseudo-terminal's slave: %w", err)
	}
	s := os.NewFile(uintptr(sfd), "pty-slave")
	if err := setWinsize(m, size); err != nil {
		m.Close()
		s.Close()
		return nil, nil, err
	}
	return m, s, nil
}

func ioctl(f *os.File, req, arg uintptr) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, arg)
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

func setWinsize(f *os.File, size PtySize) error {
	ws := struct{ Row, Col, X, Y uint16 }{Row: size.Rows, Col: size.Cols}
	if err := ioctl(f, syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws))); err != nil {
		return fmt.Errorf("setting the terminal size: %w", err)
	}
	return nil
}

// rememberPty keeps master's duplicate for pid, and forgets those of
// processes that have exited.
func (a *agent) rememberPty(pid int, master *os.File) {
	ptyMasters.Range(func(k, v any) bool {
		if p, err := a.lookup(k.(int)); err != nil || !p.info().Running {
			ptyMasters.Delete(k)
			v.(*os.File).Close()
		}
		return true
	})
	ptyMasters.Store(pid, master)
}

func (c *hostConn) handlePtyResize(s *astream, payload []byte) (any, error) {
	var req ptyResizeMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	if err := req.Size.valid(); err != nil {
		return nil, err
	}
	p, err := c.lookup(req.Pid)
	if err != nil {
		return nil, err
	}
	v, ok := ptyMasters.Load(req.Pid)
	if !ok || !p.info().Running {
		return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("process %d has no terminal", req.Pid)}
	}
	if err := setWinsize(v.(*os.File), req.Size); err != nil {
		return nil, err
	}
	return emptyMsg{}, nil
}

// ptyExec is the terminal of a process being started: the child's end,
// and the master's two duplicates that replace the parent's ends of the
// stdin and stdout pipes.
type ptyExec struct {
	master, slave   *os.File
	stdinW, stdoutR int
}

// newPtyExec opens a terminal for a process about to start.
func newPtyExec(size PtySize) (*ptyExec, error) {
	m, s, err := openPty(size)
	if err != nil {
		return nil, err
	}
	pe := &ptyExec{master: m, slave: s, stdinW: -1, stdoutR: -1}
	for _, fd := range []*int{&pe.stdinW, &pe.stdoutR} {
		if *fd, err = dupCloexec(m); err != nil {
			pe.close()
			return nil, err
		}
	}
	return pe, nil
}

func dupCloexec(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	nfd, errno := -1, syscall.Errno(0)
	rc.Control(func(fd uintptr) {
		r, _, e := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_DUPFD_CLOEXEC, 0)
		nfd, errno = int(r), e
	})
	if errno != 0 {
		return -1, fmt.Errorf("duplicating the terminal: %w", errno)
	}
	return nfd, nil
}

// sysProcAttr makes the child a session leader with the terminal as its
// controlling terminal (its fd 0).
func (pe *ptyExec) sysProcAttr() *syscall.SysProcAttr {
	return theWorkload.sysProcAttr(&syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: workloadCred, AmbientCaps: workloadCaps})
}

// childFd is the terminal's end for the child's stdin, stdout and stderr.
func (pe *ptyExec) childFd() uintptr {
	rc, _ := pe.slave.SyscallConn()
	var out uintptr
	rc.Control(func(fd uintptr) { out = fd })
	return out
}

// close releases what the parent no longer needs once the child runs (or
// failed to): the slave, and the master unless it was remembered. The
// slave must go as soon as the child has its copies: while the agent holds
// it the master never reads EOF, and the exit would be reported on a grace
// period instead of after the last output.
func (pe *ptyExec) close() {
	pe.slave.Close()
	if pe.master != nil {
		pe.master.Close()
	}
}

// outputPending reports whether output is waiting to be read from fd, an
// output pipe or a terminal's master. It polls rather than asks TIOCINQ: a
// terminal's output reaches the master's read buffer from a kernel work
// queue, which lags the writer under load, so TIOCINQ can say 0 while the
// last output of an exited process is still on its way; poll on a terminal
// first waits for that work (n_tty_poll flushes the tty buffer).
func outputPending(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return true // not known to be drained: look again later
		}
		return n > 0 && pfd[0].Revents&unix.POLLIN != 0
	}
}
