package gvisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
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

// Caps implements tier.Tier. The agent is first connected over a
// socketpair (gVisor cannot accept on a listening socket donated by the
// host); it also listens, token-checked, at AgentAddr in the sandbox's own
// network namespace, where a restarted server dials it (AdoptRunning). That
// namespace is also where the egress proxy's listeners are opened, at
// start, in a fork (ForkWithNetwork) or later (AttachNetwork). Image roots
// and volumes are served by the gofer with their on-disk ids
// (image_linux.go), hence UnmappedIDs.
func (Tier) Caps() tier.Caps {
	return tier.Caps{Pause: tier.PauseCheckpoint, MemorySnapshot: true, ConnectedAgent: true,
		AdoptRunning: true, Network: true, ForkWithNetwork: true, AttachNetwork: true,
		ImageRoots: true, Volumes: true, HostDirs: true, UnmappedIDs: true, AgentOOM: true, SnapshotEnvironments: true}
}

// Start implements tier.Tier (see liveConfig).
func (Tier) Start(cfg native.Config) (tier.Instance, []net.Listener, error) {
	sb, err := Start(liveConfig(cfg))
	if err != nil {
		return nil, nil, err
	}
	h := newHandle(sb)
	h.preamble = cfg.Agent
	return h, sb.Listeners(), nil
}

// Fork implements tier.Forker: a new sandbox from snapshot image, in a
// network namespace of its own with the proxy's listeners at cfg.Listen.
func (Tier) Fork(cfg native.Config, image string) (tier.Instance, []net.Listener, error) {
	sb, err := Fork(liveConfig(cfg), image)
	if err != nil {
		return nil, nil, err
	}
	h := newHandle(sb)
	if isTCP(image) { // WrapConn reconnects over TCP
		if err := h.setTCP(); err != nil {
			sb.Destroy()
			return nil, nil, err
		}
	}
	return h, sb.Listeners(), nil
}

// liveConfig is cfg for a sandbox the manager starts: a live sandbox
// (cfg.Agent) outlives this process, and its agent is reconnectable (agent
// "--reconnect"; a fork's arguments must be its original's, which runsc
// restore checks).
func liveConfig(cfg native.Config) native.Config {
	cfg.SurviveParent = cfg.Agent
	if cfg.Agent {
		cfg.Args = append(append([]string{}, cfg.Args...), "--reconnect="+AgentAddr)
	}
	return cfg
}

// Remove implements tier.Tier: runsc's state and the cgroups runsc made.
func (Tier) Remove(id string) { Remove(id) }

// Adopt implements tier.Adopter for a sandbox that a previous server paused
// (checkpointed to disk) and did not resume: nothing of it runs, and its
// image, bundle and cgroup are enough to restore it. It comes back
// suspended, with an agent connection whose reads and writes wait for
// Resume. With network, its egress namespace went with the previous
// server: adoption opens info.Listen in a new one (Listeners).
//
// A sandbox that was running is taken over as it runs (adoptRunning).
func (Tier) Adopt(info tier.AdoptInfo) (tier.Instance, error) {
	if !info.Paused {
		return adoptRunning(info)
	}
	sb, err := Adopt(info.ID, info.Enforced, info.Listen)
	if err != nil {
		return nil, fmt.Errorf("paused gvisor sandbox: %w", err)
	}
	h := &Handle{cur: sb, suspended: true, ended: make(chan struct{}), tcp: isTCP(sb.dir)}
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
	preamble  bool      // WrapConn sends the agent's token first (a fresh agent)
	adopted   bool      // taken over running: its first runsc is not this process's child
	tcp       bool      // the agent is reached over TCP (reconnect_linux.go)
	pidMu     sync.Mutex
	pidfd     int // an adopted one's runsc, -1 once closed
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
// For a fresh agent it first sends the agent's token (the agent reads it
// before the hello).
func (h *Handle) WrapConn(c net.Conn) net.Conn {
	if h.tcp {
		// A fork of a sandbox in TCP mode: its agent does not read the
		// socketpair; a failed reconnect shows as a failed ping.
		if t, err := reconnect(h.current()); err == nil {
			c.Close()
			c = t
		}
	}
	if h.preamble {
		// A failure shows as a failed hello.
		c.SetWriteDeadline(time.Now().Add(30 * time.Second))
		c.Write(agent.ReconnectPreamble(h.current().token))
		c.SetWriteDeadline(time.Time{})
	}
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
	if h.adopted {
		return h.destroyAdopted()
	}
	err := h.current().Destroy()
	h.End()
	return err
}

// LeaseDir implements tier.LeaseHolder: the sandbox's state directory
// (its bundle), which lives from its start to its Destroy or Remove,
// across checkpoints, restores and server restarts, as no runsc process
// does.
func (h *Handle) LeaseDir() string { return h.current().dir }

// Listeners are those an adoption opened in the sandbox's new egress
// namespace, if any.
func (h *Handle) Listeners() []net.Listener { return h.current().Listeners() }

// Suspend checkpoints the sandbox to image: everything stops and its
// memory is freed. The agent's connection is held meanwhile.
func (h *Handle) Suspend(image string) error {
	if h.conn == nil {
		return errNoSwap
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
	var c net.Conn
	if h.tcp {
		c, err = reconnect(n)
	} else {
		c, err = net.FileConn(hostEnd)
	}
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
		return errNoSwap
	}
	h.conn.hold()
	defer h.conn.release()
	cur := h.current()
	if err := cur.Snapshot(image); err != nil {
		return err
	}
	if h.tcp {
		if err := markTCP(image); err != nil {
			return err
		}
	}
	return cur.SaveToken(image)
}

// errNoSwap is returned by Suspend and Snapshot for a handle whose agent
// connection was never made (WrapConn or DialAgent not called).
var errNoSwap = errors.New("gvisor: the sandbox's agent connection is not set up; it cannot be checkpointed")

// ExitDetail implements tier.ExitDetailer: how runsc ended.
func (h *Handle) ExitDetail() string { return h.current().ExitDetail() }

// FinishCheckpoint implements tier.CheckpointSettler (FinishCheckpoint).
func (Tier) FinishCheckpoint(id, image string, wait time.Duration) (bool, error) {
	return FinishCheckpoint(id, image, wait)
}

// Run implements tier.Runner (Run).
func (Tier) Run(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error) {
	return Run(ctx, cfg, opts)
}
