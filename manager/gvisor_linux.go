package manager

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"airlock/agent"
	rt "airlock/runtime"
	"airlock/runtime/gvisor"
	"airlock/runtime/native"
	"airlock/runtime/native/cgroups"
	"airlock/store"
)

// gvisorHandle is a gvisor sandbox as the manager holds it: it outlives
// checkpoint and restore, across which the runsc process (the current
// *gvisor.Sandbox) changes. Done is closed only when the sandbox really
// ends, not when a checkpoint stops it.
type gvisorHandle struct {
	mu        sync.Mutex
	cur       *gvisor.Sandbox
	suspended bool
	conn      *swapConn // the agent's connection, set by wrap
	ended     chan struct{}
	endOnce   sync.Once
}

func newGVisorHandle(sb *gvisor.Sandbox) *gvisorHandle {
	h := &gvisorHandle{cur: sb, ended: make(chan struct{})}
	h.follow(sb)
	return h
}

// follow ends the handle when sb exits while it is the current sandbox and
// no checkpoint is under way.
func (h *gvisorHandle) follow(sb *gvisor.Sandbox) {
	go func() {
		sb.Wait()
		h.mu.Lock()
		end := h.cur == sb && !h.suspended
		h.mu.Unlock()
		if end {
			h.end()
		}
	}()
}

func (h *gvisorHandle) end() { h.endOnce.Do(func() { close(h.ended) }) }

func (h *gvisorHandle) current() *gvisor.Sandbox {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur
}

// wrap makes c the agent's connection, replaceable on restore.
func (h *gvisorHandle) wrap(c net.Conn) net.Conn {
	h.conn = newSwapConn(c)
	return h.conn
}

// Done, Stats, Enforced and Destroy make the handle a startedSandbox.
func (h *gvisorHandle) Done() <-chan struct{}         { return h.ended }
func (h *gvisorHandle) Stats() (cgroups.Stats, error) { return h.current().Stats() }
func (h *gvisorHandle) Enforced() rt.Enforced         { return h.current().Enforced() }
func (h *gvisorHandle) Destroy() error {
	err := h.current().Destroy()
	h.end()
	return err
}

// suspend checkpoints the sandbox to image: everything stops and its
// memory is freed. The agent's connection is held meanwhile.
func (h *gvisorHandle) suspend(image string) error {
	if h.conn == nil {
		return errors.New("manager: gvisor sandbox has no replaceable agent connection")
	}
	h.mu.Lock()
	h.suspended = true
	cur := h.cur
	h.mu.Unlock()
	h.conn.hold()
	// runsc holds the agent's connection too: killed meanwhile, this
	// process's end closing does not end the agent before runsc has
	// stopped the sandbox, and runsc finishes the image.
	var hold []*os.File
	if f, err := h.conn.file(); err == nil {
		defer f.Close()
		hold = append(hold, f)
	}
	if err := cur.CheckpointHolding(image, hold...); err != nil {
		h.conn.release()
		h.mu.Lock()
		h.suspended = false
		h.mu.Unlock()
		select {
		case <-cur.Done(): // runsc stopped anyway: the sandbox is gone
			h.end()
		default:
		}
		return err
	}
	return nil
}

// resume restores the sandbox from image with a new socketpair for its
// agent and a new log pipe, and continues the agent's connection on it.
func (h *gvisorHandle) resume(image string, log *os.File) error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("manager: socketpair: %w", err)
	}
	hostEnd, agentEnd := os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "agent")
	defer agentEnd.Close()
	defer hostEnd.Close()
	n, err := h.current().Restore(image, agentEnd, log, log)
	if err != nil {
		return err
	}
	c, err := net.FileConn(hostEnd)
	if err != nil {
		n.Destroy()
		return fmt.Errorf("manager: agent connection: %w", err)
	}
	h.mu.Lock()
	h.cur, h.suspended = n, false
	h.mu.Unlock()
	h.follow(n)
	h.conn.swap(c)
	return nil
}

// gvisorOf returns the handle of a gvisor sandbox started by this process.
func gvisorOf(sb *Sandbox) (*gvisorHandle, bool) {
	o, ok := sb.inst.(*ownInst)
	if !ok {
		return nil, false
	}
	h, ok := o.sb.(*gvisorHandle)
	return h, ok
}

// checkpointDir is where a suspended gvisor sandbox's image lives.
func (m *Manager) checkpointDir(id string) string { return filepath.Join(m.dir, id, "checkpoint") }

// checkpointDone marks the checkpoint image of a paused gvisor sandbox as
// complete.
func (m *Manager) checkpointDone(id string) string {
	return filepath.Join(m.dir, id, "checkpoint.done")
}

// adoptPausedGVisor takes over a gvisor sandbox that a previous server
// paused (checkpointed to disk) and did not resume: nothing of it runs,
// and its image, bundle and cgroup are enough to restore it. It comes back
// paused; Resume restores it on a new socketpair, where a client continues
// the agent's session without a hello (agent.ContinueClient). A running
// gvisor sandbox cannot be taken over: its agent was connected to the
// previous server over a socketpair, gone with it.
func (m *Manager) adoptPausedGVisor(rec *store.Sandbox, rs *runtimeState) (*Sandbox, string) {
	if why := m.settleCheckpoint(rec.ID); why != "" {
		return nil, why
	}
	// With network, its egress namespace went with the previous server:
	// adoption opens the proxy's listeners in a new one (netReattach
	// serves them).
	gsb, err := gvisor.Adopt(rec.ID, rs.Enforced, []string{ProxyHTTPAddr, ProxySOCKSAddr})
	if err != nil {
		return nil, "paused gvisor sandbox: " + err.Error()
	}
	h := &gvisorHandle{cur: gsb, suspended: true, ended: make(chan struct{})}
	gone, peer := net.Pipe()
	peer.Close()
	h.conn = newSwapConn(gone) // reads and writes wait for the restore's socket
	h.conn.hold()
	client := agent.ContinueClient(h.conn, agent.Config{Home: "/workspace"})
	inst := &ownInst{id: rec.ID, sb: h, wait: func() { <-h.Done() }}
	sb := &Sandbox{ID: rec.ID, m: m, inst: inst, client: client, reattached: true, enforced: rs.Enforced,
		ended: make(chan struct{}), rec: *rec, paused: true}
	m.netReattach(sb, rs.Secrets)
	if sb.net.listeners == nil {
		for _, l := range gsb.Listeners() { // not served: the sandbox has no network
			l.Close()
		}
	}
	return sb, ""
}

// gvisorListeners returns the proxy listeners that the adoption of a
// paused gvisor sandbox opened in its new egress namespace, if any.
func gvisorListeners(sb *Sandbox) ([]net.Listener, bool) {
	h, ok := gvisorOf(sb)
	if !ok {
		return nil, false
	}
	ls := h.current().Listeners()
	return ls, len(ls) > 0
}

// snapshotImage snapshots gvisor sandbox sb to image, leaving it running.
// Host writes to its agent wait meanwhile, so that no request is cut in
// the middle in the image.
func (m *Manager) snapshotImage(sb *Sandbox, image string) error {
	h, ok := gvisorOf(sb)
	if !ok || h.conn == nil {
		return fmt.Errorf("%w: sandbox %s is not a gvisor sandbox this server started", ErrPolicy, sb.ID)
	}
	sb.mu.Lock()
	defer sb.mu.Unlock() // no pause meanwhile
	if sb.paused || sb.ending {
		return fmt.Errorf("%w: paused or ending", ErrNotRunning)
	}
	if err := os.MkdirAll(filepath.Dir(image), 0o700); err != nil {
		return fmt.Errorf("manager: snapshot: %w", err)
	}
	h.conn.hold()
	defer h.conn.release()
	if err := h.current().Snapshot(image); err != nil {
		os.RemoveAll(image)
		if errors.Is(err, gvisor.ErrNetworkSnapshot) {
			return fmt.Errorf("%w: %w", ErrPolicy, err)
		}
		return fmt.Errorf("manager: snapshot of %s: %w", sb.ID, err)
	}
	return nil
}

// launchFork starts a fork of snapshot image (gvisor.Fork) as launch
// starts a gvisor sandbox.
func (m *Manager) launchFork(cfg native.Config, image string) (*ownInst, []net.Listener, error) {
	cfg.SurviveParent = true // as launch
	gsb, err := gvisor.Fork(cfg, image)
	if err != nil {
		return nil, nil, err
	}
	h := newGVisorHandle(gsb)
	return &ownInst{id: gsb.ID, p: gsb.Pid, sb: h, wait: func() { <-h.Done() }}, nil, nil
}
