package gvisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// adoptRunning takes over a live sandbox that a previous server started and
// left running: its `runsc run` (info.Pid, checked against its start time
// through a pidfd, so a reused pid is not taken), its cgroup, its pinned
// network namespace and its agent token are all still there. The handle's
// agent is reached with DialAgent; it ends when that runsc exits.
func adoptRunning(info tier.AdoptInfo) (tier.Instance, error) {
	if !validID(info.ID) {
		return nil, fmt.Errorf("gvisor: bad sandbox id %q", info.ID)
	}
	rs, err := Available()
	if err != nil {
		return nil, err
	}
	fd, err := unix.PidfdOpen(info.Pid, 0)
	if err != nil {
		return nil, fmt.Errorf("gvisor: runsc of %s (pid %d) is gone: %w", info.ID, info.Pid, err)
	}
	// Checked after opening: the pidfd now pins this exact process.
	if st, err := native.ProcStartTime(info.Pid); err != nil || st != info.StartTime {
		unix.Close(fd)
		return nil, fmt.Errorf("gvisor: pid %d is no longer the runsc of %s", info.Pid, info.ID)
	}
	if native.PidfdExited(fd) {
		unix.Close(fd)
		return nil, fmt.Errorf("gvisor: runsc of %s (pid %d) is gone: it exited", info.ID, info.Pid)
	}
	dir := filepath.Join(StateBase, "bundles", info.ID)
	fail := func(err error) (tier.Instance, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("gvisor: adopt running %s: %w", info.ID, err)
	}
	token, err := readToken(dir)
	if err != nil {
		return fail(err)
	}
	ns := netnsPath(info.ID)
	if !isNetns(ns) {
		return fail(errors.New("its network namespace is not pinned at " + ns))
	}
	group, err := cgroups.Lookup(info.ID)
	if err != nil {
		return fail(err)
	}
	// A server killed during the memory snapshot of an image sandbox
	// (between runsc pause and resume) left it paused: it goes on.
	if st, _ := containerStatus(rs.Path, info.ID); st == "paused" {
		if out, err := exec.Command(rs.Path, append(runscFlags(), "resume", info.ID)...).CombinedOutput(); err != nil {
			return fail(fmt.Errorf("resume it from the pause a killed snapshot left: %v: %s", err, strings.TrimSpace(string(out))))
		}
	}
	sb := &Sandbox{ID: info.ID, Pid: info.Pid, runsc: rs, dir: dir, group: group, enforced: info.Enforced,
		nsPath: ns, token: token, surviveParent: true, waitDone: make(chan struct{}), exited: make(chan struct{}), upper: readUpper(dir)}
	h := &Handle{cur: sb, adopted: true, ended: make(chan struct{}), pidfd: fd}
	if err := h.setTCP(); err != nil {
		return fail(err)
	}
	go func() {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, -1)
			if err == unix.EINTR || (err == nil && n == 0) {
				continue
			}
			break
		}
		close(sb.exited)
		h.closePidfd()
		// A checkpoint (pause) stops this runsc without ending the sandbox.
		h.mu.Lock()
		end := h.cur == sb && !h.suspended
		h.mu.Unlock()
		if end {
			h.End()
		}
	}()
	return h, nil
}

// isNetns reports whether path is a network namespace (a pinned one).
func isNetns(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// DialAgent implements tier.AgentDialer: a new connection to the agent at
// AgentAddr in the sandbox's namespace, token sent; the agent's hello
// follows. The agent serves it in place of its current connection. The
// connection becomes the handle's (Conn), carried across a checkpoint by
// reconnecting after the restore (reconnect_linux.go).
func (h *Handle) DialAgent(ctx context.Context) (net.Conn, error) {
	cur := h.current()
	if cur.nsPath == "" || cur.token == nil {
		return nil, errors.New("gvisor: this sandbox's agent is not reconnectable")
	}
	c, err := dialAgent(ctx, cur.nsPath, cur.token)
	if err != nil {
		return nil, err
	}
	h.conn = newSwapConn(c)
	return h.conn, nil
}

// ListenIn implements tier.NetAttacher: listeners in the sandbox's own
// network namespace (its runsc process is in the host's).
func (h *Handle) ListenIn(addrs []string) ([]net.Listener, error) {
	cur := h.current()
	if cur.nsPath == "" {
		return nil, errors.New("gvisor: the sandbox has no network namespace of its own")
	}
	return listenInNetns(cur.nsPath, addrs)
}

// destroyAdopted kills an adopted running sandbox: its runsc, through the
// pidfd, and everything in its cgroup; then its state goes as Destroy's.
func (h *Handle) destroyAdopted() error {
	h.pidMu.Lock()
	if h.pidfd >= 0 {
		unix.PidfdSendSignal(h.pidfd, unix.SIGKILL, nil, 0)
	}
	h.pidMu.Unlock()
	err := h.current().Destroy()
	select {
	case <-h.ended:
	case <-time.After(10 * time.Second):
	}
	h.closePidfd()
	return err
}

// closePidfd releases the pidfd of an adopted sandbox's runsc once, so that
// its number, maybe reused, is never signalled.
func (h *Handle) closePidfd() {
	h.pidMu.Lock()
	defer h.pidMu.Unlock()
	if h.pidfd >= 0 {
		unix.Close(h.pidfd)
		h.pidfd = -1
	}
}
