package manager

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/internal/spans"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
	"github.com/airlock-dev/airlock/store"
)

// Backend runs a Manager's sandboxes somewhere other than this host, such
// as pods of a Kubernetes cluster (package kube). With Config.Backend set,
// the backend is the state of record of sandboxes: Create, Get, List, Kill,
// SetTimeout, Pause, Resume, Metrics and Lookup ask it, so that several
// servers sharing one backend serve the same sandboxes and any of them may
// die. The Manager keeps the policy checks, the per-key limits and the
// audit log; what a backend cannot do (memory snapshots and forks, images
// and volumes of the host's stores, changing the network of a running
// sandbox) is refused with ErrPolicy.
type Backend interface {
	// Name names the backend in errors ("kubernetes").
	Name() string
	// Runtimes lists the isolation tiers a sandbox may ask for.
	Runtimes() []string
	// Create starts the sandbox spec describes and returns it.
	Create(ctx context.Context, spec RemoteSpec) (Info, error)
	// Get describes sandbox id of owner (ErrNotFound if there is none).
	Get(ctx context.Context, owner, id string) (Info, error)
	// Policy returns the policy of sandbox id of owner.
	Policy(ctx context.Context, owner, id string) (policy.Policy, error)
	// List returns owner's sandboxes matching opts, by id.
	List(ctx context.Context, owner string, opts ListOptions) ([]Info, error)
	// Count returns how many running sandboxes there are in all and how
	// many of them owner has (for the server's and the key's limits).
	Count(ctx context.Context, owner string) (all, owned int, err error)
	// Kill ends sandbox id of owner and removes what belongs to it.
	Kill(ctx context.Context, owner, id string) error
	// SetExpiry makes sandbox id of owner end at at.
	SetExpiry(ctx context.Context, owner, id string, at time.Time) (Info, error)
	// SetPaused pauses (true) or resumes (false) sandbox id of owner.
	SetPaused(ctx context.Context, owner, id string, paused bool) (Info, error)
	// Connect returns sandbox id of owner with a connection to its agent
	// (nil while paused), dialing it when this process has none.
	Connect(ctx context.Context, owner, id string) (RemoteSandbox, error)
	// Close releases the backend's connections; sandboxes keep running.
	Close() error
}

// RemoteSpec is a sandbox for a Backend to start.
type RemoteSpec struct {
	// ID is the new sandbox's id (sb- and 16 hex digits).
	ID string
	// Owner is the API key ID creating it ("" without auth).
	Owner string
	// Policy is the validated policy; its Runtime field is unused (see
	// Runtime).
	Policy policy.Policy
	// Runtime is the isolation tier, one of Backend.Runtimes.
	Runtime string
	// Image is the image to run ("" means the backend's default).
	Image string
	// Metadata labels the sandbox.
	Metadata map[string]string
	// Secrets are the headers the egress proxy injects (validated).
	Secrets []egress.Secret
	// ExpiresAt is when the sandbox ends.
	ExpiresAt time.Time
}

// RemoteSandbox is a running sandbox of a Backend.
type RemoteSandbox struct {
	// Info describes it.
	Info Info
	// Policy is its policy.
	Policy policy.Policy
	// Client is the connection to its agent; nil while it is paused.
	Client *agent.Client
}

// BackendCaps is a Backend that declares what the sandboxes of each of its
// runtimes can do, as the tiers of this host do (tier.Caps): the Manager
// refuses the rest before asking the backend, with an error that names the
// runtime, the backend and the capability (refuseRemote), and /v1/info
// lists them (RuntimeCaps).
type BackendCaps interface {
	Caps(runtime string) tier.Caps
}

// ErrBackend marks what the configured Backend cannot do; it is always
// wrapped with ErrPolicy (HTTP 422).
var ErrBackend = errors.New("not available with this server's backend")

// remote reports whether sandboxes run on a Backend.
func (m *Manager) remote() bool { return m.cfg.Backend != nil }

// notRemote refuses what only this host's sandboxes can do.
func (m *Manager) notRemote(what string) error {
	return fmt.Errorf("%w: %w: %s (backend %s)", ErrPolicy, ErrBackend, what, m.cfg.Backend.Name())
}

// remoteCaps returns the capabilities of runtime on the backend, if it
// declares them.
func (m *Manager) remoteCaps(runtime string) (tier.Caps, bool) {
	bc, ok := m.cfg.Backend.(BackendCaps)
	if !ok {
		return tier.Caps{}, false
	}
	return bc.Caps(runtime), true
}

// refuseRemote is the error for what runtime cannot do on the backend:
// what names the request, capability the tier.Caps field it lacks (its
// JSON name), as tier.Refuse words it for this host's tiers.
func (m *Manager) refuseRemote(runtime, what, capability string) error {
	return fmt.Errorf("%w: %w: %w: runtime %s of backend %s does not support %s (capability %s)",
		ErrPolicy, ErrBackend, tier.ErrNotSupported, runtime, m.cfg.Backend.Name(), what, capability)
}

// refuseRemoteOp is the refusal of what, an operation on running sandbox
// id of owner that needs capability: ErrNotFound if owner has no such
// sandbox, else the refusal naming the sandbox's runtime and the
// capability when the backend declares it lacks it (refuseRemote), else
// notRemote (a backend that declares nothing).
func (m *Manager) refuseRemoteOp(ctx context.Context, owner, id, what, capability string) error {
	in, err := m.cfg.Backend.Get(ctx, owner, id)
	if err != nil {
		return err
	}
	if caps, declared := m.remoteCaps(in.Runtime); declared && !caps.Has(capability) {
		return m.refuseRemote(in.Runtime, what, capability)
	}
	return m.notRemote(what)
}

// newRemoteID returns a new sandbox id of the same form as native ones.
func newRemoteID() string {
	var b [8]byte
	rand.Read(b[:])
	return "sb-" + hex.EncodeToString(b[:])
}

// createRemote is Create on a Backend.
func (m *Manager) createRemote(ctx context.Context, req CreateRequest) (Info, error) {
	sp := spans.Start()
	if err := checkMetadata(req.Metadata); err != nil {
		return Info{}, err
	}
	if req.Metadata[OnTimeoutKey] == "pause" {
		return Info{}, m.notRemote("pausing at the end of the timeout (" + OnTimeoutKey + "=pause)")
	}
	tier := req.Runtime
	if tier == "" {
		tier = string(m.cfg.DefaultRuntime)
	}
	if tier == "" {
		tier = string(policy.RuntimeNative)
	}
	if !slices.Contains(m.cfg.Backend.Runtimes(), tier) {
		return Info{}, fmt.Errorf("%w: runtime %q is not available with backend %s (it offers %v)", ErrPolicy, tier, m.cfg.Backend.Name(), m.cfg.Backend.Runtimes())
	}
	caps, declared := m.remoteCaps(tier)
	switch {
	case req.Snapshot != "" && declared && !caps.MemorySnapshot:
		return Info{}, m.refuseRemote(tier, "a fork of a memory snapshot", "memory_snapshot")
	case req.Snapshot != "":
		return Info{}, m.notRemote("forks of memory snapshots")
	case len(req.Volumes) > 0 && declared && !caps.Volumes:
		return Info{}, m.refuseRemote(tier, "volumes", "volumes")
	case len(req.Volumes) > 0:
		return Info{}, m.notRemote("volumes")
	case req.User != "":
		return Info{}, m.notRemote("user " + req.User + " (image sandboxes of this server's native runtime)")
	case req.Network.Mode != "" && req.Network.Mode != policy.NetNone && declared && !caps.Network:
		return Info{}, m.refuseRemote(tier, fmt.Sprintf("network (mode %q)", req.Network.Mode), "network")
	}
	ttl, err := m.ttl(req.Timeout)
	if err != nil {
		return Info{}, err
	}
	// The tier is the backend's business (a RuntimeClass): the policy is
	// built and checked as a native one's.
	req.Runtime = ""
	if err := m.checkCeilings(ctx, &req, ttl); err != nil {
		return Info{}, err
	}
	p, err := buildPolicy(&req)
	if err != nil {
		return Info{}, err
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return Info{}, ErrClosed
	}
	sp.Mark("checks")
	all, owned, err := m.cfg.Backend.Count(ctx, req.Owner)
	if err != nil {
		return Info{}, fmt.Errorf("manager: count sandboxes: %w", err)
	}
	if all >= m.cfg.MaxSandboxes {
		return Info{}, fmt.Errorf("%w: backend %s runs at most %d sandboxes (--max-sandboxes, counted over every server)", ErrLimit, m.cfg.Backend.Name(), m.cfg.MaxSandboxes)
	}
	if req.OwnerLimit > 0 && owned >= req.OwnerLimit {
		return Info{}, fmt.Errorf("%w: this API key may run at most %d sandboxes", ErrLimit, req.OwnerLimit)
	}
	spec := RemoteSpec{ID: newRemoteID(), Owner: req.Owner, Policy: p, Runtime: tier, Image: req.Image,
		Metadata: maps.Clone(req.Metadata), ExpiresAt: time.Now().Add(ttl).UTC(), Secrets: req.Secrets}
	sp.Mark("count")
	info, err := m.cfg.Backend.Create(ctx, spec)
	if err != nil {
		m.count(func(c *Counters) { c.CreateErrors++ })
		return Info{}, err
	}
	sp.Mark("backend")
	m.count(func(c *Counters) { c.Created++ })
	m.Audit(ctx, req.Owner, info.ID, store.ActionSandboxCreate, map[string]any{
		"profile": p.Profile, "metadata": req.Metadata, "timeout_s": ttl.Seconds(), "limits": req.Limits,
		"network": p.Network, "secrets": secretRefs(req.Secrets), "image": req.Image, "runtime": tier, "backend": m.cfg.Backend.Name()})
	sp.Mark("audit")
	sp.Add("id", info.ID)
	sp.Log("manager: remote create")
	return info, nil
}

// DefaultPolicy is the policy of a create naming only profile, as a
// Backend receives it in RemoteSpec.Policy: what a backend's warm pool
// (kube) makes its pods from, so that such creates match them.
func DefaultPolicy(profile string) (policy.Policy, error) {
	return buildPolicy(&CreateRequest{Profile: profile})
}

// remoteDialTimeout bounds finding a remote sandbox and dialing its agent.
const remoteDialTimeout = 30 * time.Second

// lookupRemote is Lookup on a Backend: the sandbox as a *Sandbox whose
// agent connection the backend holds (dialed on first use by any server).
func (m *Manager) lookupRemote(owner, id string) (*Sandbox, error) {
	ctx, cancel := context.WithTimeout(context.Background(), remoteDialTimeout)
	defer cancel()
	rs, err := m.cfg.Backend.Connect(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if rs.Info.Paused || rs.Client == nil {
		return nil, fmt.Errorf("%w: %w: resume it first", ErrNotRunning, ErrPaused)
	}
	pol, err := json.Marshal(rs.Policy)
	if err != nil {
		return nil, fmt.Errorf("manager: sandbox %s: %w", id, err)
	}
	in := rs.Info
	rec := store.Sandbox{ID: in.ID, Owner: owner, Profile: in.Profile, State: in.State, CreatedAt: in.CreatedAt,
		Metadata: in.Metadata, Policy: pol}
	if in.ExpiresAt != nil {
		rec.ExpiresAt = *in.ExpiresAt
	}
	return &Sandbox{ID: in.ID, m: m, inst: remoteInst{}, client: rs.Client, ended: make(chan struct{}), rec: rec}, nil
}

// remoteInst stands for a sandbox of a Backend: this process has no
// process or cgroup of it (OOMKills reports unknown).
type remoteInst struct{}

func (remoteInst) Pid() int              { return 0 }
func (remoteInst) Done() <-chan struct{} { return nil }
func (remoteInst) Stats() (cgroups.Stats, error) {
	return cgroups.Stats{}, errors.New("a remote sandbox's accounting is its backend's")
}
func (remoteInst) Enforced() runtime.Enforced { return nil }
func (remoteInst) Destroy() error             { return nil }

// getRemote is Get on a Backend: a sandbox it no longer has is described
// from this server's store if this server ended it.
func (m *Manager) getRemote(ctx context.Context, owner, id string) (Info, error) {
	in, err := m.cfg.Backend.Get(ctx, owner, id)
	if errors.Is(err, ErrNotFound) {
		if rec, e := m.st.GetSandbox(ctx, id); e == nil && rec.Owner == owner && rec.State != store.StateRunning {
			return infoFromRecord(rec), nil
		}
	}
	return in, err
}

// networkRemote is Network on a Backend: the policy's network section
// (secrets are not named: the backend keeps them in the egress proxy's
// Secret only).
func (m *Manager) networkRemote(ctx context.Context, owner, id string) (NetworkInfo, error) {
	p, err := m.cfg.Backend.Policy(ctx, owner, id)
	if err != nil {
		return NetworkInfo{}, err
	}
	n := p.Network
	if n.Mode == "" {
		n.Mode = policy.NetNone
	}
	return NetworkInfo{Mode: string(n.Mode), Allow: nonNil(n.Allow), Deny: nonNil(n.Deny)}, nil
}

// setTimeoutRemote is SetTimeout on a Backend.
func (m *Manager) setTimeoutRemote(ctx context.Context, owner, id string, d time.Duration) (Info, error) {
	in, err := m.cfg.Backend.SetExpiry(ctx, owner, id, time.Now().Add(d).UTC())
	if err != nil {
		return Info{}, err
	}
	m.Audit(ctx, owner, id, "sandbox.timeout", map[string]float64{"timeout_s": d.Seconds()})
	return in, nil
}

// killRemote is Kill on a Backend. The killing server records the end in
// its store, so that it can still describe the sandbox (Get, List of
// ended states) once the backend has forgotten it.
func (m *Manager) killRemote(ctx context.Context, owner, id string) error {
	in, err := m.getRemote(ctx, owner, id)
	if err != nil {
		return err
	}
	if in.State != store.StateRunning {
		return fmt.Errorf("%w: %s", ErrNotRunning, in.State)
	}
	if err := m.cfg.Backend.Kill(ctx, owner, id); err != nil {
		return err
	}
	now := time.Now().UTC()
	rt, _ := json.Marshal(map[string]string{"runtime": in.Runtime, "backend": m.cfg.Backend.Name()})
	rec := &store.Sandbox{ID: id, Owner: owner, Profile: in.Profile, State: store.StateKilled, CreatedAt: in.CreatedAt,
		EndedAt: &now, EndReason: "killed on request", Metadata: in.Metadata, Runtime: rt}
	if in.ExpiresAt != nil {
		rec.ExpiresAt = *in.ExpiresAt
	}
	if err := m.st.PutSandbox(context.WithoutCancel(ctx), rec); err != nil {
		m.cfg.Logf("sandbox %s: record its end: %v", id, err)
	}
	m.count(func(c *Counters) { c.Killed++ })
	m.Audit(ctx, owner, id, store.ActionSandboxKill, map[string]string{"reason": "request"})
	return nil
}

// setPausedRemote is Pause and Resume on a Backend.
func (m *Manager) setPausedRemote(ctx context.Context, owner, id string, on bool) (Info, error) {
	if _, err := m.cfg.Backend.Get(ctx, owner, id); err != nil {
		return Info{}, err
	}
	if err := m.AuditFirst(ctx, owner, id, pauseAction(on), nil); err != nil {
		return Info{}, err
	}
	return m.cfg.Backend.SetPaused(ctx, owner, id, on)
}

// metricsRemote is Metrics on a Backend: the disk use the agent reports
// (the pod's accounting is the kubelet's, not read here).
func (m *Manager) metricsRemote(ctx context.Context, owner, id string) (Metrics, error) {
	sb, err := m.lookupRemote(owner, id)
	if errors.Is(err, ErrPaused) {
		return Metrics{}, nil
	}
	if err != nil {
		return Metrics{}, err
	}
	var out Metrics
	if used, total, err := diskUsage(ctx, sb.client); err == nil {
		out.DiskUsedBytes, out.DiskTotalBytes = used, total
	}
	return out, nil
}
