package microvm

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/runtime/native"
)

// QEMU's ends of a guest's ports and its monitor are listening unix
// sockets in the VM's state directory (root's, 0700), made by the tier and
// handed to QEMU as descriptors (QEMU calls listen on them itself, so a
// connection's peer credentials are QEMU's): the server that started the
// VM connects to them at once, and a restarted one connects again. A port
// carries sessions (agent.SerialReady, then the host's preamble with the
// VM's token); the monitor greets each new client.

// Socket and state file names in a VM's state directory.
const (
	agentSock   = "agent.sock"
	egressSock  = "egress.sock"
	qmpSock     = "qmp.sock"
	tokenFile   = "token"        // the sessions' token (agent.ReconnectPreamble)
	runningFile = "running.json" // the current QEMU and volume daemons (runningState)
)

// listenSock makes a listening unix socket at path (replacing a stale
// one) for QEMU, which gets it as a descriptor.
func listenSock(path string) (*os.File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("microvm: socket %s: %w", path, err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("microvm: socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("microvm: bind %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("microvm: socket %s: %w", path, err)
	}
	// Listening before QEMU runs: the first connection waits in the
	// backlog until QEMU accepts it.
	if err := unix.Listen(fd, 4); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("microvm: listen %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), filepath.Base(path)), nil
}

// dialSock connects to the socket at path. With pid > 0, the listener must
// be that process (SO_PEERCRED): a socket replaced by another process's
// listener is refused before a byte is sent to it.
func dialSock(path string, pid int) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("microvm: socket: %w", err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("microvm: connect %s: %w", path, err)
	}
	if pid > 0 {
		cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("microvm: %s: peer credentials: %w", path, err)
		}
		if int(cred.Pid) != pid {
			unix.Close(fd)
			return nil, fmt.Errorf("microvm: %s is served by pid %d, not by the VM's QEMU (pid %d)", path, cred.Pid, pid)
		}
	}
	return os.NewFile(uintptr(fd), filepath.Base(path)), nil
}

// session starts a session on a port's connection f: the guest's
// agent.SerialReady must be the first bytes on it, then the preamble with
// token is sent. It gives up after wait, or when gone is closed (QEMU
// ended); f is then shut down (not closed).
func session(f *os.File, token []byte, wait time.Duration, gone <-chan struct{}) error {
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, len(agent.SerialReady))
		_, err := io.ReadFull(f, buf)
		switch {
		case err != nil:
			got <- fmt.Errorf("the guest's end of the port: %w", err)
		case string(buf) != agent.SerialReady:
			got <- fmt.Errorf("the guest's port did not start a session (%q)", buf)
		default:
			got <- nil
		}
	}()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var err error
	select {
	case err = <-got:
	case <-gone:
		err = errors.New("qemu ended")
	case <-timer.C:
		err = fmt.Errorf("no session from the guest in %s", wait)
	}
	if err == nil {
		_, err = f.Write(agent.ReconnectPreamble(token))
	}
	if err != nil {
		unix.Shutdown(int(f.Fd()), unix.SHUT_RDWR) // ends the reader above
		return fmt.Errorf("microvm: %w", err)
	}
	return nil
}

// adoptPort connects to the port socket at path of a running VM whose QEMU
// is pid and starts a session on it. A guest that has not yet seen its
// previous host go does not start one (what reaches the new connection
// first is not agent.SerialReady, or nothing does): the connection is
// closed, which the guest does see, and tried again, until deadline.
func adoptPort(path string, pid int, token []byte, deadline time.Time, gone <-chan struct{}) (*os.File, error) {
	pause := 500 * time.Millisecond
	for {
		f, err := dialSock(path, pid)
		if err != nil {
			return nil, err // a stranger's socket, or none: not retried
		}
		wait := 10 * time.Second
		if left := time.Until(deadline); left < wait {
			wait = max(left, time.Second)
		}
		err = session(f, token, wait, gone)
		if err == nil {
			return f, nil
		}
		f.Close()
		if time.Now().Add(pause).After(deadline) {
			return nil, err
		}
		select {
		case <-gone:
			return nil, err
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// newToken makes a VM's sessions' token and records it in dir.
func newToken(dir string) ([]byte, error) {
	tok := make([]byte, agent.ReconnectTokenBytes)
	if _, err := rand.Read(tok); err != nil {
		return nil, fmt.Errorf("microvm: token: %w", err)
	}
	return tok, writeToken(dir, tok)
}

// writeToken records tok in dir.
func writeToken(dir string, tok []byte) error {
	if err := os.WriteFile(filepath.Join(dir, tokenFile), tok, 0o600); err != nil {
		return fmt.Errorf("microvm: token: %w", err)
	}
	return nil
}

// readTokenFile reads the token recorded in dir.
func readTokenFile(dir string) ([]byte, error) {
	tok, err := os.ReadFile(filepath.Join(dir, tokenFile))
	if err != nil {
		return nil, fmt.Errorf("microvm: the sessions' token: %w", err)
	}
	if len(tok) != agent.ReconnectTokenBytes {
		return nil, fmt.Errorf("microvm: the sessions' token: %d bytes, want %d", len(tok), agent.ReconnectTokenBytes)
	}
	return tok, nil
}

// runningState is what runningFile records of a running VM's host
// processes: its QEMU and its volume daemons, each by pid and start time
// (/proc/PID/stat field 22), which a restarted server checks against what
// its store recorded before it takes any over.
type runningState struct {
	QEMU    procID   `json:"qemu"`
	Daemons []procID `json:"daemons,omitempty"`
}

// procID identifies a process across pid reuse.
type procID struct {
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

// idOf returns pid's procID.
func idOf(pid int) (procID, error) {
	st, err := native.ProcStartTime(pid)
	if err != nil {
		return procID{}, fmt.Errorf("microvm: start time of pid %d: %w", pid, err)
	}
	return procID{Pid: pid, StartTime: st}, nil
}

// writeRunning records the VM's current QEMU and daemons in dir,
// atomically.
func writeRunning(dir string, qemu int, daemons []int) error {
	var rs runningState
	var err error
	if rs.QEMU, err = idOf(qemu); err != nil {
		return err
	}
	for _, d := range daemons {
		id, err := idOf(d)
		if err != nil {
			return err
		}
		rs.Daemons = append(rs.Daemons, id)
	}
	b, err := json.Marshal(rs)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, runningFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("microvm: record the running VM: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, runningFile)); err != nil {
		return fmt.Errorf("microvm: record the running VM: %w", err)
	}
	return nil
}

// readRunning reads what writeRunning recorded in dir.
func readRunning(dir string) (*runningState, error) {
	b, err := os.ReadFile(filepath.Join(dir, runningFile))
	if err != nil {
		return nil, fmt.Errorf("microvm: the running VM's record: %w", err)
	}
	var rs runningState
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, fmt.Errorf("microvm: the running VM's record: %w", err)
	}
	if rs.QEMU.Pid <= 0 {
		return nil, errors.New("microvm: the running VM's record: no QEMU pid")
	}
	return &rs, nil
}

// pidfdOf opens a pidfd of id's process if it is still that process
// (same start time) and has not exited.
func pidfdOf(id procID, what string) (int, error) {
	fd, err := unix.PidfdOpen(id.Pid, 0)
	if err != nil {
		return -1, fmt.Errorf("microvm: %s (pid %d) is gone: %w", what, id.Pid, err)
	}
	// Checked after opening: the pidfd now pins this exact process.
	if st, err := native.ProcStartTime(id.Pid); err != nil || st != id.StartTime {
		unix.Close(fd)
		return -1, fmt.Errorf("microvm: %s (pid %d) is gone: the pid is another process's now", what, id.Pid)
	}
	if native.PidfdExited(fd) {
		unix.Close(fd)
		return -1, fmt.Errorf("microvm: %s (pid %d) is gone: it exited", what, id.Pid)
	}
	return fd, nil
}
