// Package tier is the one interface every isolation tier (native, gvisor,
// wasm, ...) implements, and the registry the manager finds them in.
//
// A tier is given a native.Config: the policy, the agent binary and its
// arguments, stdio, the root (host-derived, or an image's layers with a
// per-sandbox upper directory), volumes, the listeners to open in the
// sandbox's network namespace, and the uid range leased for it. It returns
// an Instance: wait (Done), kill (Destroy), stats, and the layers it
// enforced. What a tier can do beyond that is declared twice, each in one
// place: as Caps, which the manager reads to refuse a request up front with
// an error naming the tier (Refuse), and as the optional interfaces below
// (Forker, Adopter, Checkpointer, ExecRewriter), which carry the operations.
//
// Tiers register themselves by name (Register), from cmd/ or a test, so
// that the manager imports no tier.
package tier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

// PauseKind is how a tier pauses a sandbox.
type PauseKind string

// Pause kinds.
const (
	// PauseFreeze stops every process with the cgroup freezer; memory
	// stays resident.
	PauseFreeze PauseKind = "freeze"
	// PauseCheckpoint saves the whole sandbox to disk and stops it, which
	// frees its memory; resume restores it (the instance is a
	// Checkpointer).
	PauseCheckpoint PauseKind = "checkpoint"
)

// Caps declares what a tier can do beyond start, wait, kill and stats.
type Caps struct {
	// ImageRoots: the root may be an image's (or template's) layers.
	ImageRoots bool `json:"image_roots"`
	// Volumes: named volumes may be mounted.
	Volumes bool `json:"volumes"`
	// HostDirs: writable host directories may be mounted (airlock run
	// --mount, --workspace), each file the directory owner's on the host.
	HostDirs bool `json:"host_dirs"`
	// Pause is how Pause works; "" means it cannot pause.
	Pause PauseKind `json:"pause,omitempty"`
	// MemorySnapshot: a running sandbox's memory and files can be saved
	// while it runs and forked into new sandboxes (the instance is a
	// Checkpointer and the tier a Forker).
	MemorySnapshot bool `json:"memory_snapshot"`
	// SnapshotEnvironments: MemorySnapshot extends to sandboxes with an
	// image root (whose files are on the host, outside the memory image):
	// the snapshot carries the root's changes (SnapshotRootLayer).
	SnapshotEnvironments bool `json:"memory_snapshot_environments"`
	// SnapshotVolumes: MemorySnapshot extends to sandboxes with volumes or
	// host directories mounted (files shared with the host and other
	// sandboxes, which a snapshot cannot freeze).
	SnapshotVolumes bool `json:"memory_snapshot_volumes"`
	// ForkWithNetwork: a sandbox with network can be snapshotted and
	// forked.
	ForkWithNetwork bool `json:"fork_with_network"`
	// Network: a sandbox can be created with network (allowlist or open,
	// through the egress proxy); without it only network none is.
	Network bool `json:"network"`
	// AttachNetwork: a sandbox created with network none can be given a
	// network later (PUT /network).
	AttachNetwork bool `json:"attach_network"`
	// AdoptRunning: a running sandbox is taken over by the next server
	// process after a restart (the tier is an Adopter); without it only a
	// paused one is, if the tier is an Adopter at all.
	AdoptRunning bool `json:"adopt_running"`
	// Pooled: idle sandboxes of this tier can be kept warm in the pool.
	Pooled bool `json:"pooled"`
	// ConnectedAgent: the agent must be given a connected socket (stdin)
	// rather than a listening one to accept on.
	ConnectedAgent bool `json:"-"`
	// AgentOOM: the agent enforces the workload's memory limit and counts
	// its out-of-memory kills (the ping reply's oom_kills), which add to the
	// host cgroup's.
	AgentOOM bool `json:"-"`
	// FullAgent: the agent must be the whole airlock binary, not the
	// agent-only build.
	FullAgent bool `json:"-"`
	// UnmappedIDs: what the sandbox writes in its image root's upper
	// directory (and volumes) carries its own uids and gids (0-65535) on
	// the host, not those of its leased host range: a snapshot of its
	// root is committed with id base 0.
	UnmappedIDs bool `json:"-"`
}

// Tier is one isolation tier.
type Tier interface {
	// Name is the runtime name a request gives ("native", "gvisor"...).
	Name() policy.Runtime
	// Available returns nil if this host can run the tier, else why not
	// and how to fix it.
	Available() error
	// Caps declares what the tier can do.
	Caps() Caps
	// Start starts cfg's agent under the tier. The listeners are those of
	// cfg.Listen, opened in the sandbox's network namespace.
	Start(cfg native.Config) (Instance, []net.Listener, error)
	// Remove removes what the tier keeps on the host for sandbox id once
	// its processes are gone (state a restart left behind); idempotent.
	Remove(id string)
}

// Instance is one running sandbox of a tier, as this process holds it.
type Instance interface {
	// Pid is the sandbox's init on the host (or the process that holds it).
	Pid() int
	// Done is closed when the sandbox has ended (not when a checkpoint
	// stops it for a while); the tier reaps its processes.
	Done() <-chan struct{}
	// Stats reads its resource accounting.
	Stats() (cgroups.Stats, error)
	// Enforced lists the layers applied.
	Enforced() rt.Enforced
	// Destroy kills everything of it and removes what it held.
	Destroy() error
}

// SnapshotRootLayer is the directory, in the memory snapshot image of a
// sandbox with an image root, holding that root's changes at the snapshot
// (its upper directory, copied while the sandbox was stopped, whiteouts
// and all). A fork's root is the original's image with this directory as
// its top layer, read-only, below an upper directory of the fork's own:
// forks never share a writable layer.
const SnapshotRootLayer = "root-layer"

// SnapshotRootDisk is the file, in the memory snapshot image of a sandbox
// whose root's changes live on a disk image of the tier's (microvm's upper
// disk, which the host never mounts), holding a copy of that disk made
// while the sandbox was stopped. Where it is, the manager files no root
// layers (SnapshotRootLayer): the tier's Fork gives each fork a writable
// copy of its own.
const SnapshotRootDisk = "root.disk"

// Forker is a tier that starts new sandboxes from a memory snapshot.
type Forker interface {
	Fork(cfg native.Config, image string) (Instance, []net.Listener, error)
}

// AdoptInfo is what a restarted server knows of a sandbox the previous one
// started.
type AdoptInfo struct {
	ID        string
	Pid       int
	StartTime uint64 // /proc/PID/stat field 22 when it started
	Enforced  rt.Enforced
	// Paused: it was paused (checkpointed, for a PauseCheckpoint tier)
	// when the previous server stopped, and its image is complete.
	Paused bool
	// Listen are the addresses to open in its (new) network namespace,
	// for a tier whose namespace went with the previous server.
	Listen []string
}

// Adopter is a tier whose sandboxes a restarted server can take over.
type Adopter interface {
	// Adopt returns the sandbox as an Instance. For an instance that is a
	// Checkpointer and info.Paused, it comes back suspended: resume it.
	Adopt(info AdoptInfo) (Instance, error)
}

// Checkpointer is an instance that can be saved to disk: for PauseCheckpoint
// (Suspend, Resume) and MemorySnapshot (Snapshot) tiers. It owns the agent's
// connection (WrapConn) so that the stream goes on across a restore.
type Checkpointer interface {
	// WrapConn makes c the agent's connection, replaceable on restore,
	// and returns what the client must use.
	WrapConn(c net.Conn) net.Conn
	// Conn is the agent's connection as WrapConn returned it (for an
	// adopted suspended instance, one that waits for Resume).
	Conn() net.Conn
	// Suspend saves the sandbox to image and stops it; its memory is freed.
	Suspend(image string) error
	// Resume restores it from image; log receives the agent's output.
	Resume(image string, log *os.File) error
	// Snapshot saves it to image and leaves it running.
	Snapshot(image string) error
	// End marks it ended (a failed resume: nothing runs any more).
	End()
}

// Listening is an instance that holds listeners of its own, opened by its
// adoption in a new network namespace.
type Listening interface {
	Listeners() []net.Listener
}

// AgentDialer is an instance whose agent a server reaches by dialing it
// rather than through a socket in its state directory: how a restarted
// server reconnects to a sandbox adopted running.
type AgentDialer interface {
	// DialAgent connects to the agent, ready for a client's hello.
	DialAgent(ctx context.Context) (net.Conn, error)
}

// NetAttacher is an instance that opens the egress proxy's listeners in a
// network namespace of its own, which its pid does not lead to (gVisor's
// runsc runs in the host's).
type NetAttacher interface {
	ListenIn(addrs []string) ([]net.Listener, error)
}

// ExecRewriter is a tier whose execs run something other than argv as it
// is (wasm: a module run by the agent's wasm-exec).
type ExecRewriter interface {
	ExecArgv(p *policy.Policy, argv []string, shell bool) ([]string, error)
}

// ErrUnknown is returned for a runtime no tier is registered for.
var ErrUnknown = errors.New("unknown runtime")

// ErrNotSupported is wrapped by Refuse.
var ErrNotSupported = errors.New("not supported")

var (
	mu    sync.RWMutex
	tiers = map[policy.Runtime]Tier{}
)

// Register makes t available under t.Name(). It panics on a duplicate.
func Register(t Tier) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := tiers[t.Name()]; dup {
		panic("tier: " + string(t.Name()) + " registered twice")
	}
	tiers[t.Name()] = t
}

// Lookup returns the tier registered as name ("" is native).
func Lookup(name policy.Runtime) (Tier, error) {
	if name == "" {
		name = policy.RuntimeNative
	}
	mu.RLock()
	t, ok := tiers[name]
	mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q (this build has %v)", ErrUnknown, name, Names())
	}
	return t, nil
}

// Names lists the registered tiers, sorted.
func Names() []policy.Runtime {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]policy.Runtime, 0, len(tiers))
	for n := range tiers {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Has reports whether c has the capability named as in its JSON form
// ("image_roots", "pause", ...).
func (c Caps) Has(name string) bool {
	switch name {
	case "image_roots":
		return c.ImageRoots
	case "volumes":
		return c.Volumes
	case "pause":
		return c.Pause != ""
	case "memory_snapshot":
		return c.MemorySnapshot
	case "memory_snapshot_environments":
		return c.SnapshotEnvironments
	case "memory_snapshot_volumes":
		return c.SnapshotVolumes
	case "fork_with_network":
		return c.ForkWithNetwork
	case "network":
		return c.Network
	case "attach_network":
		return c.AttachNetwork
	case "adopt_running":
		return c.AdoptRunning
	case "pooled":
		return c.Pooled
	}
	return false
}

// Refuse is the error for what tier t cannot do: what names the request
// ("volumes", "an image or template root"), capability the Caps field it
// lacks (its JSON name). Every such refusal reads the same: it names the
// tier, the capability and the registered tiers that have it.
func Refuse(t Tier, what, capability string) error {
	var have []string
	for _, n := range Names() {
		if o, err := Lookup(n); err == nil && o.Caps().Has(capability) {
			have = append(have, string(n))
		}
	}
	alt := "no runtime of this build has it"
	if len(have) > 0 {
		alt = "runtimes that have it: " + strings.Join(have, ", ")
	}
	return fmt.Errorf("%w: runtime %s does not support %s (capability %s; %s)", ErrNotSupported, t.Name(), what, capability, alt)
}

// OOMCounter is an instance that reads its out-of-memory kill counter
// alone, cheaper than Stats (an exec reads it before every command).
type OOMCounter interface {
	OOMKills() (int64, error)
}

// Backgrounder is an instance whose CPU weight can be lowered against the
// other sandboxes (a pooled sandbox while it waits).
type Backgrounder interface {
	SetBackground(on bool) error
}

// AgentReserver is an instance whose agent threads must leave the
// workload's cgroup once the agent has said hello (spawnerTid is the thread
// that stays, to fork workloads into it).
type AgentReserver interface {
	ReserveAgent(spawnerTid int) error
}

// ExitDetailer is an instance that can say how it ended ("runsc (pid N)
// killed by signal 9 after 0.4 s"), for the log line of an unexpected end.
type ExitDetailer interface {
	ExitDetail() string
}

// CheckpointSettler is a PauseCheckpoint tier that can finish, after a
// server restart, a checkpoint that a killed server had started: it waits
// up to wait for the checkpoint of sandbox id into image and reports
// whether the image is whole (the sandbox then stopped after writing it).
// Not whole and no error means the checkpoint never began: the sandbox
// runs on, to be taken over running.
type CheckpointSettler interface {
	FinishCheckpoint(id, image string, wait time.Duration) (whole bool, err error)
}

// LeaseHolder is an instance whose host processes do not span its life
// (a checkpoint ends them, a restore starts others): its host id range
// lease is held by the directory LeaseDir names, which exists exactly as
// long as the sandbox does, paused or running, across server restarts,
// instead of by its pid ("" if it has none: its pid holds it then).
type LeaseHolder interface {
	LeaseDir() string
}

// Runner is a tier that runs one-shot sandboxes (airlock run, a template's
// RUN step): start, wait with the policy's deadline and output cap, result.
type Runner interface {
	Run(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error)
}
