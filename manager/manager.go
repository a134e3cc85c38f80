// Package manager owns the lifecycle of long-lived sandboxes: it creates
// them (a native sandbox whose PID 1 is the agent), tracks them in the
// store, enforces per-server and per-key limits, kills them when their TTL
// passes, records an audit trail, and after a crash of the server reattaches
// to the sandboxes that survived or records them as lost.
//
// # Shutdown
//
// Close kills every sandbox by default. With Config.KeepOnShutdown it only
// disconnects: the sandboxes keep running (their agents wait AgentGrace for
// a new connection) and the next Manager opened on the same state directory
// reattaches to them.
package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/tier"
	"github.com/airlock-dev/airlock/store"
	"github.com/airlock-dev/airlock/volume"
)

// Errors returned (wrapped) by the Manager. The server maps them to HTTP
// status codes.
var (
	// ErrNotFound: no such sandbox, or it belongs to another owner.
	ErrNotFound = errors.New("sandbox not found")
	// ErrNotRunning: the sandbox exists but has ended.
	ErrNotRunning = errors.New("sandbox is not running")
	// ErrLimit: a sandbox limit (per server or per key) is reached.
	ErrLimit = errors.New("sandbox limit reached")
	// ErrInvalid: the request is malformed (bad metadata, timeout...).
	ErrInvalid = errors.New("invalid request")
	// ErrPolicy: the requested policy is invalid.
	ErrPolicy = errors.New("invalid policy")
	// ErrClosed: the manager is shutting down.
	ErrClosed = errors.New("manager is closed")
	// ErrAudit: the audit record of an action could not be written, so
	// the action was refused (fail closed). Wraps store.ErrNoSpace when
	// the state directory is full.
	ErrAudit = errors.New("the audit record could not be written, so the action was refused")
)

// Config configures a Manager.
type Config struct {
	// StateDir holds per-sandbox directories (agent sockets, logs) under
	// StateDir/sandboxes. It should be the store's directory.
	StateDir string
	// Store persists sandboxes and the audit log. Required.
	Store *store.Store
	// Images is the image store CreateRequest.Image names images of; nil
	// refuses image sandboxes.
	Images *imagestore.Store
	// Volumes is the volume store CreateRequest.Volumes names volumes of;
	// nil refuses volumes.
	Volumes *volume.Store
	// AgentBinary is the airlock binary, bound into each sandbox and run
	// as its agent. Required.
	AgentBinary string
	// LeanAgent, if set, is an agent-only build (cmd/airlock-agent) of
	// the same source, bound and run instead of AgentBinary in every
	// sandbox but the wasm runtime's (whose commands run the full
	// binary's wasm-exec): a sandbox's agent then starts faster and holds
	// less memory. The caller checks that it matches (agent.BuildStamp).
	LeanAgent string
	// MaxSandboxes caps running sandboxes on this server; 0 means 100.
	MaxSandboxes int
	// AllowDegraded starts sandboxes even when cgroups are unavailable.
	AllowDegraded bool
	// DefaultTimeout is the TTL of a sandbox created without one; 0 means
	// 15 minutes.
	DefaultTimeout time.Duration
	// MaxTimeout caps any TTL; 0 means 24 hours.
	MaxTimeout time.Duration
	// SnapshotQuota caps the disk used by all snapshot images (MemorySnapshot);
	// 0 means 8 GiB.
	SnapshotQuota int64
	// Ceilings cap the limits a sandbox may ask for; zero fields are the
	// host's (policy.HostCeilings), and none may exceed the host's.
	Ceilings policy.Ceilings
	// ReapInterval is how often expired sandboxes are looked for; 0 means
	// one second.
	ReapInterval time.Duration
	// AgentGrace is how long an agent whose host connection dropped waits
	// for a new one before killing everything; 0 means 10 minutes.
	AgentGrace time.Duration
	// KeepOnShutdown leaves sandboxes running on Close for a later
	// Manager to reattach.
	KeepOnShutdown bool
	// Logf logs operational events; log.Printf if nil.
	Logf func(format string, args ...any)
	// Egress configures the egress proxy of sandboxes whose network mode
	// is not none (see network.go).
	Egress EgressConfig
	// DefaultRuntime runs sandboxes created without a runtime; empty means
	// native.
	DefaultRuntime policy.Runtime
	// Observe, if set, is told how long each create, pause, resume and
	// egress connection took (manager/observe.go); it must not block.
	Observe func(Observation)
	// Backend, if set, runs the sandboxes instead of this host and is their
	// state of record (backend.go); nil runs them here.
	Backend Backend
}

// CreateRequest describes a sandbox to create.
type CreateRequest struct {
	// Owner is the API key ID creating it ("" without auth).
	Owner string
	// OwnerLimit is the owner's own cap on running sandboxes; 0 means none.
	OwnerLimit int
	// Profile is the policy preset; "" means strict.
	Profile string
	// Limits overrides the preset's limits; zero fields keep the preset.
	Limits Limits
	// Env is added to the sandbox's environment.
	Env map[string]string
	// Metadata labels the sandbox for listing.
	Metadata map[string]string
	// Timeout is the TTL from now; 0 means Config.DefaultTimeout.
	Timeout time.Duration
	// Network is the network policy; an empty mode means none.
	Network policy.Network
	// Secrets are headers the egress proxy injects. Their values stay in
	// this process's memory: never stored, audited or given to the sandbox.
	Secrets []egress.Secret
	// Runtime is the isolation tier, native or gvisor; "" means
	// Config.DefaultRuntime.
	Runtime string
	// Image names an image of Config.Images to make the sandbox's root
	// from (writable, on disk); "" means the host-derived root.
	Image string
	// User "root" makes an image sandbox's user uid 0 of its own user
	// namespace with native.RootCaps there; "" means the image's user.
	User string

	// Volumes are named volumes mounted read-write in the sandbox.
	Volumes []VolumeRef
	// Snapshot names a snapshot (Manager.MemorySnapshot) of a gvisor sandbox of
	// the same owner: the new sandbox is a fork, an independent copy of the
	// snapshotted one (its policy; Profile, Limits, Env, Network, Runtime,
	// Image and Volumes are not used).
	Snapshot string

	image *imagestore.Image // resolved by Create
	snap  *snapshot         // resolved by Create
}

// Limits are the per-sandbox resource overrides a client may request.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
	DiskBytes   int64   `json:"disk_bytes,omitempty"`
}

// Info describes a sandbox, running or ended.
type Info struct {
	ID         string            `json:"id"`
	State      string            `json:"state"`
	Profile    string            `json:"profile"`
	Metadata   map[string]string `json:"metadata"`
	CreatedAt  time.Time         `json:"created_at"`
	ExpiresAt  *time.Time        `json:"expires_at,omitempty"`
	EndedAt    *time.Time        `json:"ended_at,omitempty"`
	EndReason  string            `json:"end_reason,omitempty"`
	Reattached bool              `json:"reattached,omitempty"`
	Enforced   runtime.Enforced  `json:"enforced,omitempty"`
	// Runtime is the isolation tier the sandbox runs under.
	Runtime string `json:"runtime,omitempty"`
	// Paused is set while the sandbox is frozen (Pause); its state stays
	// running and its TTL keeps counting.
	Paused bool `json:"paused,omitempty"`
}

// Metrics is a sandbox's resource use now.
type Metrics struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryBytes     int64   `json:"memory_bytes"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`
	Pids            int64   `json:"pids"`
	OOMKills        int64   `json:"oom_kills"`
	DiskUsedBytes   int64   `json:"disk_used_bytes"`
	DiskTotalBytes  int64   `json:"disk_total_bytes"`
}

// Counters are cumulative counts for the Prometheus endpoint.
type Counters struct {
	Running, Created, Killed, Expired, Lost, Reattached, CreateErrors int64
}

// Sandbox is a running sandbox held by the Manager.
type Sandbox struct {
	// ID is the sandbox's id.
	ID string

	m          *Manager
	inst       tier.Instance
	client     *agent.Client
	enforced   runtime.Enforced
	reattached bool
	ended      chan struct{}

	mu     sync.Mutex
	rec    store.Sandbox
	paused bool // frozen by Pause (guarded by mu)
	ending bool // finish has begun: no more Pause (guarded by mu)
	// rtName is the runtime record's tier name once decoded, and
	// rewrites whether that tier rewrites exec argv (rewritesKnown: decided
	// yet). A sandbox's tier does not change during its life, so every exec
	// need not decode the records again (guarded by mu).
	rtName                  string
	rewrites, rewritesKnown bool
	end                     sync.Once

	net netState
}

// Agent returns the connection to the sandbox's agent.
func (s *Sandbox) Agent() *agent.Client { return s.client }

// Owner is the API key ID that owns the sandbox.
func (s *Sandbox) Owner() string { return s.rec.Owner }

// Ended is closed once the sandbox has ended.
func (s *Sandbox) Ended() <-chan struct{} { return s.ended }

// UserName is the name of the user every process of the sandbox runs as:
// "user" (uid 1000 of its own user namespace) by default, "root" (uid 0 of
// it) for an image sandbox whose image runs as root or that was created
// with User "root"; "" if its policy cannot be read.
func (s *Sandbox) UserName() string {
	p, ok := s.policy()
	if !ok {
		return ""
	}
	return p.User.Name
}

// WorkDir is the working directory of the sandbox's program: /workspace
// by default, an image's WORKDIR for an image sandbox; "" if its policy
// cannot be read.
func (s *Sandbox) WorkDir() string {
	p, ok := s.policy()
	if !ok {
		return ""
	}
	return p.Filesystem.Workdir
}

// policy decodes the sandbox's recorded policy.
func (s *Sandbox) policy() (policy.Policy, bool) {
	s.mu.Lock()
	raw := s.rec.Policy
	s.mu.Unlock()
	var p policy.Policy
	return p, json.Unmarshal(raw, &p) == nil
}

// runtimeName is info().Runtime without building the whole Info; it is
// on every exec's path (the request metrics' runtime label).
func (s *Sandbox) runtimeName() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rtName == "" {
		s.rtName = runtimeOfRecord(&s.rec)
	}
	return s.rtName
}

func (s *Sandbox) info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	return infoLocked(s)
}

func infoFromRecord(r *store.Sandbox) Info {
	in := Info{ID: r.ID, State: r.State, Profile: r.Profile, Metadata: maps.Clone(r.Metadata),
		CreatedAt: r.CreatedAt, EndReason: r.EndReason, EndedAt: r.EndedAt}
	if in.Metadata == nil {
		in.Metadata = map[string]string{}
	}
	if !r.ExpiresAt.IsZero() {
		t := r.ExpiresAt
		in.ExpiresAt = &t
	}
	in.Runtime = runtimeOfRecord(r)
	return in
}

// runtimeOfRecord is the tier name in r's runtime record ("" if none).
func runtimeOfRecord(r *store.Sandbox) string {
	var rs struct {
		Runtime string `json:"runtime"`
	}
	if json.Unmarshal(r.Runtime, &rs) != nil {
		return ""
	}
	return rs.Runtime
}

// Manager runs sandboxes. It is safe for concurrent use.
type Manager struct {
	cfg Config
	st  *store.Store
	dir string // StateDir/sandboxes

	snaps sync.Map // snapshot id -> *snapshot

	starts *startGate // tiers that boot a kernel: starts at once (startgate.go)

	mu       sync.Mutex
	live     map[string]*Sandbox
	pending  int            // creates in progress
	perOwner map[string]int // running + pending, by owner
	closed   bool

	egress   *egress.Proxy
	connSem  chan struct{} // bounds network log writes in flight
	netLogMu sync.Mutex
	netLog   map[string]*netLogBucket // per-sandbox network log rate limit
	connWG   sync.WaitGroup           // network log writes in flight

	ctrMu sync.Mutex
	ctr   Counters

	stop     chan struct{}
	reaperWG sync.WaitGroup

	pool *pool // warm pool (pool.go); nil without one

	disks      *native.DiskPool // ready upper disks of image roots (image.go); opened on first use
	disksTried bool

	execGate ExecGate // asked before an exec is audited (SetExecGate)

	anomalies anomalyState // WatchAnomalies (anomaly.go)

	backlogMu sync.Mutex
	backlog   []backlogWrite // failed store writes, retried by the reaper
}

// maxSocketPath is the longest path a unix socket may be bound to
// (sizeof(sockaddr_un.sun_path) - 1).
const maxSocketPath = 107

// Open starts a Manager: it recovers the sandboxes a previous server left
// running (reattaching or recording them as lost, and removing everything
// that remains of the lost ones), then starts the TTL reaper.
func Open(cfg Config) (*Manager, error) {
	if cfg.Store == nil || cfg.StateDir == "" || cfg.AgentBinary == "" {
		return nil, errors.New("manager: Store, StateDir and AgentBinary are required")
	}
	if cfg.MaxSandboxes <= 0 {
		cfg.MaxSandboxes = 100
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = 15 * time.Minute
	}
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = 24 * time.Hour
	}
	var err error
	// A backend's sandboxes run on other machines: this host's size is
	// no ceiling of theirs (the configured ceilings are, and the
	// cluster's own quotas).
	if cfg.Backend == nil {
		if cfg.Ceilings, err = hostCeilings(cfg.Ceilings); err != nil {
			return nil, err
		}
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.AgentGrace <= 0 {
		cfg.AgentGrace = 10 * time.Minute
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("manager: state dir: %w", err)
	}
	m := &Manager{cfg: cfg, st: cfg.Store, starts: newStartGate(0), dir: filepath.Join(abs, "sandboxes"),
		live: map[string]*Sandbox{}, perOwner: map[string]int{}, stop: make(chan struct{})}
	// Every sandbox's agent listens on STATE/sandboxes/ID/agent.sock; a
	// unix socket path has at most 107 bytes. Refuse a state dir too deep
	// for them now rather than failing every create.
	if sock := filepath.Join(m.dir, "sb-0123456789abcdef", "agent.sock"); len(sock) > maxSocketPath {
		return nil, fmt.Errorf("manager: state dir %s is too deep: agent sockets such as %s would have %d bytes, and a unix socket path may have at most %d; choose a shorter state dir",
			abs, sock, len(sock), maxSocketPath)
	}
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return nil, fmt.Errorf("manager: create %s: %w", m.dir, err)
	}
	if err := os.Chmod(m.dir, 0o700); err != nil {
		return nil, fmt.Errorf("manager: chmod %s: %w", m.dir, err)
	}
	m.openEgress()
	if cfg.Backend != nil {
		// Nothing of this host to recover: the backend holds the
		// sandboxes. The reaper still flushes the store backlog.
		m.reaperWG.Add(1)
		go m.reaper()
		return m, nil
	}
	if err := m.recover(context.Background()); err != nil {
		m.closeEgress()
		return nil, fmt.Errorf("manager: recovery: %w", err)
	}
	m.reaperWG.Add(1)
	go m.reaper()
	return m, nil
}

func (m *Manager) count(f func(c *Counters)) {
	m.ctrMu.Lock()
	f(&m.ctr)
	m.ctrMu.Unlock()
}

// Counters returns cumulative counters and the number running now.
func (m *Manager) Counters() Counters {
	m.ctrMu.Lock()
	c := m.ctr
	m.ctrMu.Unlock()
	m.mu.Lock()
	c.Running = int64(len(m.live))
	m.mu.Unlock()
	return c
}

// Audit appends an event to the audit log about something that has
// already happened; failures are logged and the write is retried in the
// background (see retryLater) until it succeeds or the manager closes.
func (m *Manager) Audit(ctx context.Context, keyID, sandboxID, action string, detail any) {
	ev := auditEvent(keyID, sandboxID, action, detail)
	if err := m.st.Audit(context.WithoutCancel(ctx), ev); err != nil {
		m.cfg.Logf("audit %s %s: %v (retrying)", action, sandboxID, err)
		m.retryLater(nil, func() error { return m.st.Audit(context.Background(), ev) })
	}
}

// AuditFirst records an action about to happen. If the record cannot be
// written it returns an error wrapping ErrAudit (and store.ErrNoSpace on a
// full disk): the caller must then not act.
func (m *Manager) AuditFirst(ctx context.Context, keyID, sandboxID, action string, detail any) error {
	if err := m.gateExec(ctx, keyID, sandboxID, action, detail); err != nil {
		return err
	}
	if err := m.st.Audit(context.WithoutCancel(ctx), auditEvent(keyID, sandboxID, action, detail)); err != nil {
		return fmt.Errorf("%w: %w", ErrAudit, err)
	}
	return nil
}

func auditEvent(keyID, sandboxID, action string, detail any) store.AuditEvent {
	var raw json.RawMessage
	if detail != nil {
		b, err := json.Marshal(detail)
		if err == nil {
			raw = b
		}
	}
	return store.AuditEvent{Time: time.Now(), KeyID: keyID, SandboxID: sandboxID, Action: action, Detail: raw}
}

// backlogWrite is a store write that failed (full disk) and is retried by
// the reaper. sb, if set, has ended but its end is not in the store yet:
// Get and List answer from it meanwhile.
type backlogWrite struct {
	sb    *Sandbox
	write func() error
}

// maxBacklog bounds the audit records kept for retry; sandbox ends are
// always kept.
const maxBacklog = 10000

// retryLater queues write to be retried every ReapInterval.
func (m *Manager) retryLater(sb *Sandbox, write func() error) {
	m.backlogMu.Lock()
	defer m.backlogMu.Unlock()
	if sb == nil && len(m.backlog) >= maxBacklog {
		m.cfg.Logf("store write backlog full (%d): dropping an audit record", maxBacklog)
		return
	}
	m.backlog = append(m.backlog, backlogWrite{sb: sb, write: write})
}

// flushBacklog retries the queued writes in order, keeping those that
// still fail.
func (m *Manager) flushBacklog() {
	m.backlogMu.Lock()
	defer m.backlogMu.Unlock()
	kept := m.backlog[:0]
	for _, b := range m.backlog {
		if err := b.write(); err != nil {
			kept = append(kept, b)
		}
	}
	clear(m.backlog[len(kept):])
	m.backlog = kept
}

// unrecorded returns the ended sandbox id whose end the store does not
// have yet, or nil.
func (m *Manager) unrecorded(id string) *Sandbox {
	m.backlogMu.Lock()
	defer m.backlogMu.Unlock()
	for _, b := range m.backlog {
		if b.sb != nil && b.sb.ID == id {
			return b.sb
		}
	}
	return nil
}

// checkMetadata validates metadata labels.
func checkMetadata(md map[string]string) error {
	if len(md) > 32 {
		return fmt.Errorf("%w: at most 32 metadata entries", ErrInvalid)
	}
	for k, v := range md {
		if !policy.ValidLabel(k) {
			return fmt.Errorf("%w: metadata key %q must match [A-Za-z0-9_.-]{1,64}", ErrInvalid, k)
		}
		if len(v) > 256 {
			return fmt.Errorf("%w: metadata value of %q longer than 256 bytes", ErrInvalid, k)
		}
	}
	if v, ok := md[OnTimeoutKey]; ok && v != "pause" && v != "kill" {
		return fmt.Errorf("%w: metadata %s must be pause or kill, not %q", ErrInvalid, OnTimeoutKey, v)
	}
	if v, ok := md[PauseMemoryKey]; ok && v != "true" && v != "false" {
		return fmt.Errorf("%w: metadata %s must be true or false, not %q", ErrInvalid, PauseMemoryKey, v)
	}
	return nil
}

// buildPolicy turns a request into a validated policy.
func buildPolicy(req *CreateRequest) (policy.Policy, error) {
	p, err := policy.Preset(policy.Profile(req.Profile))
	if err != nil {
		return p, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	l := req.Limits
	if l.MemoryBytes < 0 || l.CPUs < 0 || l.Pids < 0 || l.DiskBytes < 0 {
		return p, fmt.Errorf("%w: negative limit", ErrPolicy)
	}
	if l.MemoryBytes != 0 {
		p.Limits.MemoryBytes = l.MemoryBytes
	}
	if l.CPUs != 0 {
		p.Limits.CPUs = l.CPUs
	}
	if l.Pids != 0 {
		p.Limits.Pids = l.Pids
	}
	if l.DiskBytes != 0 {
		p.Limits.DiskBytes = l.DiskBytes
	}
	if p.Runtime, err = policy.ParseRuntime(req.Runtime); err != nil {
		return p, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	if err := applyNetwork(&p, req); err != nil {
		return p, err
	}
	if err := checkRuntimePolicy(&p, req); err != nil {
		return p, err
	}
	if len(req.Env) > 128 {
		return p, fmt.Errorf("%w: at most 128 environment variables", ErrPolicy)
	}
	keys := make([]string, 0, len(req.Env))
	for k := range req.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := req.Env[k]
		if !policy.ValidEnvKey(k) || len(v) > 32<<10 {
			return p, fmt.Errorf("%w: bad environment variable %q", ErrPolicy, k)
		}
		p.SetEnv(k, v)
	}
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	return p, nil
}

// reserve takes a slot for a new sandbox of owner.
func (m *Manager) reserve(owner string, ownerLimit int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if len(m.live)+m.pending >= m.cfg.MaxSandboxes {
		return fmt.Errorf("%w: this server runs at most %d sandboxes", ErrLimit, m.cfg.MaxSandboxes)
	}
	if ownerLimit > 0 && m.perOwner[owner] >= ownerLimit {
		return fmt.Errorf("%w: this API key may run at most %d sandboxes", ErrLimit, ownerLimit)
	}
	m.pending++
	m.perOwner[owner]++
	return nil
}

// create is Create (manager/observe.go times it).
func (m *Manager) create(ctx context.Context, req CreateRequest) (Info, error) {
	if m.remote() {
		return m.createRemote(ctx, req)
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return Info{}, err
	}
	ttl, err := m.ttl(req.Timeout)
	if err != nil {
		return Info{}, err
	}
	if err := m.checkCeilings(ctx, &req, ttl); err != nil {
		return Info{}, err
	}
	if req.Snapshot != "" {
		if err := m.resolveSnapshot(&req); err != nil {
			return Info{}, err
		}
	}
	if req.Runtime == "" {
		req.Runtime = string(m.cfg.DefaultRuntime)
	}
	if err := checkRuntime(req.Runtime); err != nil {
		return Info{}, err
	}
	if info, ok, err := m.createPooled(ctx, &req, ttl); ok {
		return info, err
	}
	p, err := buildPolicy(&req)
	if err != nil {
		return Info{}, err
	}
	if req.snap != nil {
		p = req.snap.policy
	}
	if req.image, err = m.resolveImage(&req, &p); err != nil {
		return Info{}, err
	}
	if req.snap != nil {
		if req.image, err = m.snapshotBase(req.snap); err != nil {
			return Info{}, err
		}
	}
	if err := m.checkVolumes(&req); err != nil {
		return Info{}, err
	}
	if err := m.reserveOrEvict(req.Owner, req.OwnerLimit); err != nil {
		return Info{}, err
	}
	sb, err := m.start(ctx, &req, p, ttl)
	m.mu.Lock()
	m.pending--
	if err != nil || m.closed {
		m.perOwner[req.Owner]--
	} else {
		m.live[sb.ID] = sb
	}
	closed := m.closed
	m.mu.Unlock()
	if err != nil {
		m.count(func(c *Counters) { c.CreateErrors++ })
		return Info{}, err
	}
	if closed {
		m.finish(sb, store.StateKilled, "server shutting down")
		return Info{}, ErrClosed
	}
	go m.watch(sb)
	m.count(func(c *Counters) { c.Created++ })
	m.Audit(ctx, req.Owner, sb.ID, store.ActionSandboxCreate, map[string]any{
		"profile": p.Profile, "metadata": req.Metadata, "timeout_s": ttl.Seconds(), "limits": req.Limits,
		"network": p.Network, "secrets": secretRefs(req.Secrets), "image": req.Image, "volumes": req.Volumes})
	return sb.info(), nil
}

// watch ends the sandbox's record when its init exits on its own.
func (m *Manager) watch(sb *Sandbox) {
	select {
	case <-sb.inst.Done():
		// Unless a kill is under way, this is unexpected: say why, with
		// what the agent's log (removed by finish) said last.
		detail := exitDetail(sb.inst) + agentLogTail(filepath.Join(m.dir, sb.ID, "agent.log"))
		if m.finish(sb, store.StateExited, "the sandbox's agent exited") {
			m.cfg.Logf("sandbox %s: ended: the sandbox's agent exited%s", sb.ID, detail)
		}
	case <-sb.ended:
	}
}

// exitDetail is what the sandbox's runtime says of its end ("; ..."),
// where it says anything.
func exitDetail(inst any) string {
	if d, ok := inst.(tier.ExitDetailer); ok {
		return "; " + d.ExitDetail()
	}
	return ""
}

// finish ends a running sandbox once: kill it, remove its cgroup and state
// directory, record the end state.
func (m *Manager) finish(sb *Sandbox, state, reason string) bool {
	first := false
	sb.end.Do(func() {
		first = true
		if sb.client != nil {
			sb.client.Close()
		}
		m.netEnd(sb)
		sb.thawForEnd()
		if err := sb.inst.Destroy(); err != nil {
			m.cfg.Logf("sandbox %s: destroy: %v", sb.ID, err)
		}
		m.freeIDs(sb.rec.UIDBase)
		if err := removeSandboxDir(filepath.Join(m.dir, sb.ID)); err != nil {
			m.cfg.Logf("sandbox %s: remove state dir: %v", sb.ID, err)
		}
		now := time.Now().UTC()
		record := func() error {
			err := m.st.EndSandbox(context.Background(), sb.ID, state, reason, now)
			if errors.Is(err, store.ErrEnded) {
				return nil
			}
			return err
		}
		if err := record(); err != nil {
			// Never leave the store saying "running" about a killed
			// sandbox: answer from memory and retry until it is written.
			m.cfg.Logf("sandbox %s: record end: %v (retrying)", sb.ID, err)
			m.retryLater(sb, record)
		}
		sb.mu.Lock()
		sb.rec.State, sb.rec.EndReason, sb.rec.EndedAt = state, reason, &now
		sb.mu.Unlock()
		m.mu.Lock()
		if m.live[sb.ID] == sb {
			delete(m.live, sb.ID)
			m.perOwner[sb.rec.Owner]--
			if m.perOwner[sb.rec.Owner] <= 0 {
				delete(m.perOwner, sb.rec.Owner)
			}
		}
		m.mu.Unlock()
		close(sb.ended)
		switch state {
		case store.StateKilled:
			m.count(func(c *Counters) { c.Killed++ })
		case store.StateExpired:
			m.count(func(c *Counters) { c.Expired++ })
		}
	})
	return first
}

// lookupAny returns a running sandbox owned by owner, paused or not.
func (m *Manager) lookupAny(owner, id string) (*Sandbox, error) {
	if m.remote() {
		// Every operation a Backend can do asks it before coming here.
		return nil, m.notRemote("this operation")
	}
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb != nil {
		if sb.rec.Owner != owner {
			return nil, ErrNotFound
		}
		return sb, nil
	}
	if sb := m.unrecorded(id); sb != nil && sb.rec.Owner == owner {
		return nil, fmt.Errorf("%w: %s", ErrNotRunning, sb.info().State)
	}
	rec, err := m.st.GetSandbox(context.Background(), id)
	if err != nil || rec.Owner != owner {
		return nil, ErrNotFound
	}
	return nil, fmt.Errorf("%w: %s", ErrNotRunning, rec.State)
}

// Get describes a sandbox owned by owner, running or ended.
func (m *Manager) Get(ctx context.Context, owner, id string) (Info, error) {
	if m.remote() {
		return m.getRemote(ctx, owner, id)
	}
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb == nil {
		sb = m.unrecorded(id)
	}
	if sb != nil && sb.rec.Owner == owner {
		return sb.info(), nil
	}
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return Info{}, ErrNotFound
		}
		return Info{}, fmt.Errorf("manager: get %s: %w", id, err)
	}
	if rec.Owner != owner {
		return Info{}, ErrNotFound
	}
	return infoFromRecord(rec), nil
}

// ListOptions filter List.
type ListOptions struct {
	// Metadata keeps sandboxes with all of these labels.
	Metadata map[string]string
	// States keeps sandboxes in these states; empty means running only.
	States []string
	// Limit caps the results; 0 means 1000 (the most).
	Limit int
	// After resumes a listing after this sandbox id (ids sort as listed).
	After string
}

// Defaults returns the states (running if none) and the limit (1000 if
// none or more) a listing with opts keeps.
func (opts ListOptions) Defaults() (states []string, limit int) {
	states = opts.States
	if len(states) == 0 {
		states = []string{store.StateRunning}
	}
	limit = opts.Limit
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	return states, limit
}

// ttl checks a requested timeout and returns the sandbox's TTL (the
// default for 0).
func (m *Manager) ttl(d time.Duration) (time.Duration, error) {
	if d < 0 {
		return 0, fmt.Errorf("%w: negative timeout", ErrInvalid)
	}
	if d == 0 {
		d = m.cfg.DefaultTimeout
	}
	if d > m.cfg.MaxTimeout {
		return 0, fmt.Errorf("%w: timeout above the maximum %s", ErrInvalid, m.cfg.MaxTimeout)
	}
	return d, nil
}

// List returns the owner's sandboxes matching opts, by id.
func (m *Manager) List(ctx context.Context, owner string, opts ListOptions) ([]Info, error) {
	if m.remote() {
		return m.cfg.Backend.List(ctx, owner, opts)
	}
	states, limit := opts.Defaults()
	recs, err := m.st.ListSandboxes(ctx, store.ListFilter{Owner: owner, States: states, Metadata: opts.Metadata, Limit: limit, After: opts.After})
	if err != nil {
		return nil, fmt.Errorf("manager: list: %w", err)
	}
	out := make([]Info, 0, len(recs))
	for _, r := range recs {
		if r.Owner != owner {
			continue
		}
		m.mu.Lock()
		sb := m.live[r.ID]
		m.mu.Unlock()
		if sb == nil {
			sb = m.unrecorded(r.ID)
		}
		if sb != nil {
			if in := sb.info(); slices.Contains(states, in.State) {
				out = append(out, in)
			}
		} else {
			out = append(out, infoFromRecord(r))
		}
	}
	return out, nil
}

// Kill kills a running sandbox owned by owner.
func (m *Manager) Kill(ctx context.Context, owner, id string) error {
	if m.remote() {
		return m.killRemote(ctx, owner, id)
	}
	sb, err := m.lookupAny(owner, id)
	if err != nil {
		return err
	}
	if !m.finish(sb, store.StateKilled, "killed on request") {
		return fmt.Errorf("%w: already ended", ErrNotRunning)
	}
	m.Audit(ctx, owner, id, store.ActionSandboxKill, map[string]string{"reason": "request"})
	return nil
}

// SetTimeout makes a running sandbox expire d from now.
func (m *Manager) SetTimeout(ctx context.Context, owner, id string, d time.Duration) (Info, error) {
	if d <= 0 || d > m.cfg.MaxTimeout {
		return Info{}, fmt.Errorf("%w: timeout must be positive and at most %s", ErrInvalid, m.cfg.MaxTimeout)
	}
	if kl, err := m.keyLimits(ctx, owner); err != nil {
		return Info{}, err
	} else if err := checkKeyTimeout(kl, d); err != nil {
		return Info{}, err
	}
	if m.remote() {
		return m.setTimeoutRemote(ctx, owner, id, d)
	}
	sb, err := m.lookupAny(owner, id)
	if err != nil {
		return Info{}, err
	}
	at := time.Now().Add(d).UTC()
	if err := m.st.SetExpiry(ctx, id, at); err != nil {
		if errors.Is(err, store.ErrEnded) {
			return Info{}, ErrNotRunning
		}
		return Info{}, fmt.Errorf("manager: set timeout: %w", err)
	}
	sb.mu.Lock()
	sb.rec.ExpiresAt = at
	sb.mu.Unlock()
	m.Audit(ctx, owner, id, "sandbox.timeout", map[string]float64{"timeout_s": d.Seconds()})
	return sb.info(), nil
}

// Metrics reads a running sandbox's resource use: cgroup accounting from
// the host, disk use from the agent (statfs of /workspace, inside).
func (m *Manager) Metrics(ctx context.Context, owner, id string) (Metrics, error) {
	if m.remote() {
		return m.metricsRemote(ctx, owner, id)
	}
	sb, err := m.lookupAny(owner, id)
	if err != nil {
		return Metrics{}, err
	}
	var out Metrics
	if st, err := sb.inst.Stats(); err == nil {
		out.CPUSeconds = st.CPUTime.Seconds()
		out.MemoryBytes, out.PeakMemoryBytes, out.Pids, out.OOMKills = st.MemoryBytes, st.PeakMemoryBytes, st.Pids, st.OOMKills
	}
	if sb.Paused() {
		return out, nil // the agent is frozen: host-side accounting only
	}
	if n := sb.OOMKills(); n > out.OOMKills {
		out.OOMKills = n // gvisor: with the agent's kills
	}
	used, total, err := diskUsage(ctx, sb.client)
	if err == nil {
		out.DiskUsedBytes, out.DiskTotalBytes = used, total
	}
	return out, nil
}

// reaper kills sandboxes whose TTL passed.
func (m *Manager) reaper() {
	defer m.reaperWG.Done()
	t := time.NewTicker(m.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.flushBacklog()
		now := time.Now()
		m.mu.Lock()
		var due []*Sandbox
		for _, sb := range m.live {
			sb.mu.Lock()
			if !sb.rec.ExpiresAt.IsZero() && now.After(sb.rec.ExpiresAt) {
				due = append(due, sb)
			}
			sb.mu.Unlock()
		}
		m.mu.Unlock()
		for _, sb := range due {
			if m.pauseOnTimeout(sb) {
				continue
			}
			if m.finish(sb, store.StateExpired, "timeout expired") {
				m.Audit(context.Background(), "", sb.ID, store.ActionSandboxKill, map[string]string{"reason": "expired"})
			}
		}
	}
}

// Close stops the reaper and kills every sandbox, or with KeepOnShutdown
// only disconnects from them so that the next Manager reattaches.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	all := make([]*Sandbox, 0, len(m.live))
	for _, sb := range m.live {
		all = append(all, sb)
	}
	pl := m.pool
	m.mu.Unlock()
	if pl != nil {
		pl.close()
	}
	close(m.stop)
	m.reaperWG.Wait()
	var wg sync.WaitGroup
	for _, sb := range all {
		if m.cfg.KeepOnShutdown {
			sb.client.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if m.finish(sb, store.StateKilled, "server shut down") {
				m.Audit(context.Background(), "", sb.ID, store.ActionSandboxKill, map[string]string{"reason": "shutdown"})
			}
		}()
	}
	wg.Wait()
	m.closeDisks()
	if m.cfg.Volumes != nil {
		// Volumes stay mounted while the server runs (a sandbox's create
		// does not wait for a mount); a clean stop leaves mounted only
		// those of the sandboxes it leaves running.
		if err := m.cfg.Volumes.UnmountIdle(); err != nil {
			m.cfg.Logf("shutdown: %v", err)
		}
	}
	m.flushBacklog()
	m.backlogMu.Lock()
	if n := len(m.backlog); n > 0 {
		m.cfg.Logf("%d store writes (sandbox ends, audit records) could not be made before shutdown", n)
	}
	m.backlogMu.Unlock()
	m.closeEgress()
	if m.remote() {
		if err := m.cfg.Backend.Close(); err != nil {
			return fmt.Errorf("manager: close backend %s: %w", m.cfg.Backend.Name(), err)
		}
	}
	return nil
}

// agentBinary is the binary bound as the agent of a sandbox with policy
// p: the lean agent when there is one, except for the wasm runtime, whose
// commands run the full binary's wasm-exec.
func (m *Manager) agentBinary(p *policy.Policy) string {
	if t, err := tier.Lookup(p.Runtime); m.cfg.LeanAgent != "" && (err != nil || !t.Caps().FullAgent) {
		return m.cfg.LeanAgent
	}
	return m.cfg.AgentBinary
}

// AgentBinary reports the host binary run as the agent of native and
// gvisor sandboxes: the agent-only build when there is one (wasm
// sandboxes always run Config.AgentBinary). It is "" with a Backend, whose
// sandboxes bring their own.
func (m *Manager) AgentBinary() string {
	if m.cfg.Backend != nil {
		return ""
	}
	return m.agentBinary(&policy.Policy{})
}
