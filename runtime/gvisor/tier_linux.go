package gvisor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"airlock/policy"
	rt "airlock/runtime"
	"airlock/runtime/native"
	"airlock/runtime/native/cgroups"
	"airlock/runtime/tier"
)

// Tier is the gvisor tier (tier.Tier): sandboxes behind gVisor's sentry,
// paused by checkpoint to disk, snapshotted while running and forked.
type Tier struct{}

// Name implements tier.Tier.
func (Tier) Name() policy.Runtime { return policy.RuntimeGVisor }

// Available implements tier.Tier: runsc is installed and airlock is root.
func (Tier) Available() error {
	_, err := Available()
	return err
}

// Caps implements tier.Tier. Image roots and volumes are served by the
// gofer with their on-disk ids (image_linux.go), hence UnmappedIDs. The agent is connected over a socketpair
// (gVisor cannot accept on a listening socket donated by the host), which
// is why a running sandbox is not adopted after a restart: its agent's
// connection went with the previous server.
func (Tier) Caps() tier.Caps {
	return tier.Caps{Pause: tier.PauseCheckpoint, MemorySnapshot: true, ConnectedAgent: true,
		ImageRoots: true, Volumes: true, UnmappedIDs: true}
}

// Start implements tier.Tier.
func (Tier) Start(cfg native.Config) (tier.Instance, []net.Listener, error) {
	cfg.SurviveParent = false
	sb, err := Start(cfg)
	if err != nil {
		return nil, nil, err
	}
	return newHandle(sb), sb.Listeners(), nil
}

// Fork implements tier.Forker: a new sandbox from snapshot image.
func (Tier) Fork(cfg native.Config, image string) (tier.Instance, []net.Listener, error) {
	cfg.SurviveParent = false
	sb, err := Fork(cfg, image)
	if err != nil {
		return nil, nil, err
	}
	return newHandle(sb), nil, nil
}

// Remove implements tier.Tier: runsc's state and the cgroups runsc made.
func (Tier) Remove(id string) { Remove(id) }

// ErrNotPaused is returned by Adopt for a sandbox that was running when the
// previous server stopped.
var ErrNotPaused = errors.New("gvisor sandboxes are not reattached after a restart unless paused (their agent was connected to the previous server over a socketpair)")

// Adopt implements tier.Adopter for a sandbox that a previous server paused
// (checkpointed to disk) and did not resume: nothing of it runs, and its
// image, bundle and cgroup are enough to restore it. It comes back
// suspended, with an agent connection whose reads and writes wait for
// Resume. With network, its egress namespace went with the previous
// server: adoption opens info.Listen in a new one (Listeners).
func (Tier) Adopt(info tier.AdoptInfo) (tier.Instance, error) {
	if !info.Paused {
		return nil, ErrNotPaused
	}
	sb, err := Adopt(info.ID, info.Enforced, info.Listen)
	if err != nil {
		return nil, fmt.Errorf("paused gvisor sandbox: %w", err)
	}
	h := &Handle{cur: sb, suspended: true, ended: make(chan struct{})}
	gone, peer := net.Pipe()
	peer.Close()
	h.conn = newSwapConn(gone) // reads and writes wait for the restore's socket
	h.conn.hold()
	return h, nil
}

// Handle is a gvisor sandbox as the manager holds it (tier.Instance and
// tier.Checkpointer): it outlives checkpoint and restore, across which the
// runsc process (the current *Sandbox) changes. Done is closed only when
// the sandbox really ends, not when a checkpoint stops it.
type Handle struct {
	mu        sync.Mutex
	cur       *Sandbox
	suspended bool
	conn      *swapConn // the agent's connection, set by WrapConn
	ended     chan struct{}
	endOnce   sync.Once
}

func newHandle(sb *Sandbox) *Handle {
	h := &Handle{cur: sb, ended: make(chan struct{})}
	h.follow(sb)
	return h
}

// follow ends the handle when sb exits while it is the current sandbox and
// no checkpoint is under way.
func (h *Handle) follow(sb *Sandbox) {
	go func() {
		sb.Wait()
		h.mu.Lock()
		end := h.cur == sb && !h.suspended
		h.mu.Unlock()
		if end {
			h.End()
		}
	}()
}

// End marks the sandbox ended.
func (h *Handle) End() { h.endOnce.Do(func() { close(h.ended) }) }

func (h *Handle) current() *Sandbox {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur
}

// WrapConn makes c the agent's connection, replaceable on restore.
func (h *Handle) WrapConn(c net.Conn) net.Conn {
	h.conn = newSwapConn(c)
	return h.conn
}

// Conn is the agent's connection as WrapConn (or Adopt) made it.
func (h *Handle) Conn() net.Conn { return h.conn }

// Pid, Done, Stats, Enforced and Destroy make the handle a tier.Instance.
func (h *Handle) Pid() int                      { return h.current().Pid }
func (h *Handle) Done() <-chan struct{}         { return h.ended }
func (h *Handle) Stats() (cgroups.Stats, error) { return h.current().Stats() }
func (h *Handle) Enforced() rt.Enforced         { return h.current().Enforced() }
func (h *Handle) Destroy() error {
	err := h.current().Destroy()
	h.End()
	return err
}

// Listeners are those an adoption opened in the sandbox's new egress
// namespace, if any.
func (h *Handle) Listeners() []net.Listener { return h.current().Listeners() }

// Suspend checkpoints the sandbox to image: everything stops and its
// memory is freed. The agent's connection is held meanwhile.
func (h *Handle) Suspend(image string) error {
	if h.conn == nil {
		return errors.New("gvisor: sandbox has no replaceable agent connection")
	}
	h.mu.Lock()
	h.suspended = true
	cur := h.cur
	h.mu.Unlock()
	h.conn.hold()
	if err := cur.Checkpoint(image); err != nil {
		h.conn.release()
		h.mu.Lock()
		h.suspended = false
		h.mu.Unlock()
		select {
		case <-cur.Done(): // runsc stopped anyway: the sandbox is gone
			h.End()
		default:
		}
		return err
	}
	return nil
}

// Resume restores the sandbox from image with a new socketpair for its
// agent and a new log pipe, and continues the agent's connection on it.
func (h *Handle) Resume(image string, log *os.File) error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("gvisor: socketpair: %w", err)
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
		return fmt.Errorf("gvisor: agent connection: %w", err)
	}
	h.mu.Lock()
	h.cur, h.suspended = n, false
	h.mu.Unlock()
	h.follow(n)
	h.conn.swap(c)
	return nil
}

// Snapshot saves the sandbox to image and leaves it running. Host writes
// to its agent wait meanwhile, so that no request is cut in the middle in
// the image.
func (h *Handle) Snapshot(image string) error {
	if h.conn == nil {
		return errors.New("gvisor: sandbox has no replaceable agent connection")
	}
	h.conn.hold()
	defer h.conn.release()
	err := h.current().Snapshot(image)
	if errors.Is(err, ErrNetworkSnapshot) || errors.Is(err, ErrImageSnapshot) {
		return fmt.Errorf("%w: %w", tier.ErrNotSupported, err)
	}
	return err
}
