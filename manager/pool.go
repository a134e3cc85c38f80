package manager

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/tier"
	"github.com/airlock-dev/airlock/store"
)

// Warm pools.
//
// A pool keeps Size ready sandboxes per profile: namespaces and cgroup
// built, agent up and connected, and with WarmPython a default Python code
// context whose kernel has already run `import numpy as np` and `import
// pandas as pd` (so np and pd are defined in it, and the first
// cell of a pooled sandbox counts as its second execution). A Create is
// served from the pool exactly when it asks for nothing a pooled sandbox
// was not built with:
//
//   - its profile is one of the pool's (an E2B template is a profile plus a
//     metadata label, so every template of a pooled profile qualifies);
//   - no Limits overrides, no Env, no Secrets, and the network mode is
//     empty or "none".
//
// Owner, OwnerLimit, Metadata and Timeout are applied at hand-out: the
// sandbox's record gets its owner, labels, creation time and expiry then,
// and the audit event says pooled. Other requests start a sandbox as usual.
//
// Every pooled sandbox holds one of the server's MaxSandboxes slots, so
// running plus pooled never exceeds the limit; a Create that finds the
// server full while the pool holds idle sandboxes evicts one to make room.
// The pool refills in the background after each hand-out.
//
// Image pools (PoolConfig.Images) keep Size ready sandboxes of each named
// image of the image store, with the default profile, warmed by
// PoolConfig.WarmImage (the server starts a desktop image's desktop there,
// so that a computer-use client's first screenshot does not wait for X and
// XFCE to start). A Create naming the image is served from its pool under
// the same conditions as above (and no User), and only when the image the
// name means for the request's owner is the very image (by digest) the
// pooled sandbox runs: a key's own image of the same name, or a public
// image imported again since, gets a fresh sandbox (a stale pooled one is
// replaced).

// PoolConfig configures a warm pool.
type PoolConfig struct {
	// Size is how many ready sandboxes to keep per profile; 0 disables
	// the pool.
	Size int
	// Profiles are the pooled profiles; empty means the default profile
	// ("", strict).
	Profiles []string
	// WarmPython starts each pooled sandbox's default Python context and
	// imports numpy as np and pandas as pd in it. Contexts created later
	// start empty.
	WarmPython bool
	// Images names published images of the server's image store whose
	// sandboxes are pooled too, Size of each, with the default profile.
	Images []string
	// WarmImage, if set, is called on each pooled image sandbox once it
	// runs, with the image's name; an error drops the sandbox.
	WarmImage func(ctx context.Context, sb *Sandbox, image string) error
}

// imageKeyPrefix starts the pool key of an image pool (profile names
// never hold a NUL).
const imageKeyPrefix = "image\x00"

// poolOwner owns idle pooled sandboxes; it is not a valid API key id.
const poolOwner = "\x00pool"

// poolRetry is how long the filler waits after a failure or a full server.
const poolRetry = time.Second

// poolRefillDelay is how long after a take the pool starts replacing the
// sandbox taken, so that the replacement's start does not compete with
// the taker's first commands.
const poolRefillDelay = 250 * time.Millisecond

type pool struct {
	m   *Manager
	cfg PoolConfig

	mu     sync.Mutex
	idle   map[string][]*Sandbox    // by pool key (profile, or imageKeyPrefix+name), oldest first
	digest map[*Sandbox]string      // the image of each idle image sandbox
	wake   map[string]chan struct{} // one per filler: a take wakes them all
	stop   chan struct{}
	wg     sync.WaitGroup
}

// StartPool starts a warm pool (see the package's pool documentation). It
// may be called once, after Open.
func (m *Manager) StartPool(cfg PoolConfig) error {
	if cfg.Size <= 0 {
		return nil
	}
	if len(cfg.Profiles) == 0 {
		cfg.Profiles = []string{""}
	}
	for i, pr := range cfg.Profiles {
		if _, err := policy.Preset(policy.Profile(pr)); err != nil {
			return fmt.Errorf("manager: pool profile: %w", err)
		}
		cfg.Profiles[i] = poolKey(pr)
	}
	keys := slices.Clone(cfg.Profiles)
	for _, name := range cfg.Images {
		if m.cfg.Images == nil {
			return fmt.Errorf("manager: pool image %q: this server has no image store", name)
		}
		// Only a published image: the pool builds as nobody's key.
		if _, err := m.cfg.Images.As(poolOwner).Get(name); err != nil {
			return fmt.Errorf("manager: pool image %q: not a published image of the store: %w", name, err)
		}
		keys = append(keys, imageKeyPrefix+name)
	}
	p := &pool{m: m, cfg: cfg, idle: map[string][]*Sandbox{}, digest: map[*Sandbox]string{},
		wake: map[string]chan struct{}{}, stop: make(chan struct{})}
	for _, k := range keys {
		p.wake[k] = make(chan struct{}, 1)
	}
	m.mu.Lock()
	if m.pool != nil || m.closed {
		m.mu.Unlock()
		return errors.New("manager: pool already started or manager closed")
	}
	m.pool = p
	m.mu.Unlock()
	for _, k := range keys {
		p.wg.Add(1)
		go p.fill(k)
	}
	return nil
}

// BackendReserve is what a Backend that keeps sandboxes ready for creates
// (kube's reserve) reports of them.
type BackendReserve interface {
	// ReserveIdle is how many it holds ready now.
	ReserveIdle() int
	// ReserveSize is how many it keeps per pooled profile.
	ReserveSize() int
}

// PoolReserve is the Backend's reserve size (BackendReserve), 0 if it
// keeps none.
func (m *Manager) PoolReserve() int {
	if r, ok := m.cfg.Backend.(BackendReserve); ok && m.remote() {
		return r.ReserveSize()
	}
	return 0
}

// PoolIdle reports how many ready sandboxes the pool holds now: on a
// Backend, its reserve (BackendReserve) if it keeps one.
func (m *Manager) PoolIdle() int {
	if m.remote() {
		if r, ok := m.cfg.Backend.(BackendReserve); ok {
			return r.ReserveIdle()
		}
		return 0
	}
	m.mu.Lock()
	p := m.pool
	m.mu.Unlock()
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.idle {
		n += len(l)
	}
	return n
}

// poolKey names a profile's pool: "" and the default profile's name are
// the same pool.
func poolKey(profile string) string {
	if p, err := policy.Preset(policy.Profile(profile)); err == nil {
		return string(p.Profile)
	}
	return profile
}

// poolable reports whether req can be served by a pooled sandbox.
func poolable(req *CreateRequest) bool {
	return req.Limits == (Limits{}) && len(req.Env) == 0 && len(req.Secrets) == 0 && len(req.Volumes) == 0 &&
		req.User == "" && req.Snapshot == "" && (req.Image == "" || poolKey(req.Profile) == poolKey("")) &&
		(req.Network.Mode == "" || req.Network.Mode == policy.NetNone) &&
		pooledTier(req.Runtime)

}

// pooledTier reports whether sandboxes of runtime name are what the pool
// holds: those of the default tier (""), if it declares Pooled.
func pooledTier(name string) bool {
	t, err := tier.Lookup(policy.Runtime(name))
	if err != nil {
		return false
	}
	def, err := tier.Lookup("")
	return err == nil && t == def && t.Caps().Pooled
}

// fill keeps profile's idle list at Size.
func (p *pool) fill(profile string) {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		need := len(p.idle[profile]) < p.cfg.Size
		p.mu.Unlock()
		if need {
			sb, err := p.build(profile)
			if err == nil {
				p.mu.Lock()
				p.idle[profile] = append(p.idle[profile], sb)
				p.mu.Unlock()
				go p.watchIdle(profile, sb)
				continue
			}
			if !errors.Is(err, ErrLimit) {
				p.m.cfg.Logf("pool: building a %q sandbox: %v", profile, err)
			}
		}
		t := time.NewTimer(poolRetry)
		if !need {
			t.Stop()
		}
		select {
		case <-p.stop:
			t.Stop()
			return
		case <-p.wake[profile]:
		case <-t.C:
		}
		t.Stop()
	}
}

// build starts one pooled sandbox for pool key, holding a slot for it.
func (p *pool) build(key string) (*Sandbox, error) {
	m := p.m
	if err := m.reserve(poolOwner, 0); err != nil {
		return nil, err
	}
	req := CreateRequest{Owner: poolOwner, Profile: key}
	image, isImage := strings.CutPrefix(key, imageKeyPrefix)
	if isImage {
		req = CreateRequest{Owner: poolOwner, Image: image}
	}
	pol, err := buildPolicy(&req)
	if err == nil && isImage {
		req.image, err = m.resolveImage(&req, &pol)
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var sb *Sandbox
		if sb, err = m.start(ctx, &req, pol, m.cfg.DefaultTimeout); err == nil {
			// Warm with the CPU that sandboxes in use leave over: a
			// refill started by a take must not slow the taker's first
			// commands (createPooled restores the weight).
			if berr := sb.background(true); berr != nil {
				m.cfg.Logf("pool: sandbox %s: %v (warming at normal CPU weight)", sb.ID, berr)
			}
			if p.cfg.WarmPython && !isImage {
				err = warmPython(ctx, sb)
			}
			if isImage && p.cfg.WarmImage != nil {
				err = p.cfg.WarmImage(ctx, sb, image)
			}
			if err == nil {
				if isImage {
					p.mu.Lock()
					p.digest[sb] = req.image.Digest
					p.mu.Unlock()
				}
				return sb, nil
			}
			m.finish(sb, store.StateKilled, "pool: warming failed")
		}
	}
	p.release()
	return nil, err
}

// warmPython starts the default Python context and imports numpy as np
// and pandas as pd in it.
func warmPython(ctx context.Context, sb *Sandbox) error {
	cell, err := sb.Agent().RunCode(ctx, agent.CodeRequest{Language: "python",
		Code: "import numpy as np\nimport pandas as pd"})
	if err != nil {
		return fmt.Errorf("warming python: %w", err)
	}
	res, err := cell.Wait(ctx)
	if err != nil {
		return fmt.Errorf("warming python: %w", err)
	}
	if res.Error != nil {
		return fmt.Errorf("warming python: %s", res.Error)
	}
	return nil
}

// release gives back the slot of a pooled sandbox that is gone.
func (p *pool) release() {
	m := p.m
	m.mu.Lock()
	m.pending--
	if m.perOwner[poolOwner]--; m.perOwner[poolOwner] <= 0 {
		delete(m.perOwner, poolOwner)
	}
	m.mu.Unlock()
}

// remove takes sb off the idle list; it reports whether it was there.
func (p *pool) remove(profile string, sb *Sandbox) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.idle[profile]
	for i, s := range l {
		if s == sb {
			p.idle[profile] = append(l[:i:i], l[i+1:]...)
			delete(p.digest, sb)
			return true
		}
	}
	return false
}

// watchIdle drops an idle sandbox whose agent exits.
func (p *pool) watchIdle(profile string, sb *Sandbox) {
	select {
	case <-sb.inst.Done():
		if p.remove(profile, sb) {
			p.m.finish(sb, store.StateExited, "pool: the sandbox's agent exited")
			p.release()
			p.kick()
		}
	case <-sb.ended:
	case <-p.stop:
	}
}

func (p *pool) kick() {
	for _, w := range p.wake {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// take pops an idle sandbox of pool key. For an image pool, digest is the
// image the request means: idle sandboxes of another image (imported
// again since they were built) are popped into stale, for the caller to
// finish.
func (p *pool) take(key, digest string) (sb *Sandbox, stale []*Sandbox) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.idle[key]
	for len(l) > 0 && p.digest[l[0]] != digest {
		stale = append(stale, l[0])
		delete(p.digest, l[0])
		l = l[1:]
	}
	if len(l) > 0 {
		sb = l[0]
		delete(p.digest, sb)
		l = l[1:]
	}
	p.idle[key] = l
	return sb, stale
}

// evict kills one idle sandbox to free its slot; it reports whether it did.
func (p *pool) evict() bool {
	var sb *Sandbox
	p.mu.Lock()
	for pr, l := range p.idle {
		if len(l) > 0 {
			sb = l[len(l)-1]
			p.idle[pr] = l[:len(l)-1]
			delete(p.digest, sb)
			break
		}
	}
	p.mu.Unlock()
	if sb == nil {
		return false
	}
	p.m.finish(sb, store.StateKilled, "pool: evicted to make room")
	p.release()
	return true
}

// close stops the fillers and kills the idle sandboxes.
func (p *pool) close() {
	close(p.stop)
	p.wg.Wait()
	p.mu.Lock()
	var all []*Sandbox
	for _, l := range p.idle {
		all = append(all, l...)
	}
	p.idle = map[string][]*Sandbox{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, sb := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.m.finish(sb, store.StateKilled, "server shut down")
			p.release()
		}()
	}
	wg.Wait()
}

// reserveOrEvict is reserve, evicting an idle pooled sandbox when the
// server is full.
func (m *Manager) reserveOrEvict(owner string, ownerLimit int) error {
	err := m.reserve(owner, ownerLimit)
	for err != nil && errors.Is(err, ErrLimit) {
		m.mu.Lock()
		p := m.pool
		full := len(m.live)+m.pending >= m.cfg.MaxSandboxes
		m.mu.Unlock()
		if p == nil || !full || !p.evict() {
			return err
		}
		err = m.reserve(owner, ownerLimit)
	}
	return err
}

// createPooled serves req from the pool if it can; ok is false when it
// cannot (then Create starts a sandbox as usual).
func (m *Manager) createPooled(ctx context.Context, req *CreateRequest, ttl time.Duration) (info Info, ok bool, err error) {
	m.mu.Lock()
	p := m.pool
	m.mu.Unlock()
	if p == nil || !poolable(req) {
		return Info{}, false, nil
	}
	key, digest := poolKey(req.Profile), ""
	if req.Image != "" {
		// The image the name means for this owner must be the published
		// one the pool builds (not the owner's own of the same name).
		if m.cfg.Images == nil || !slices.Contains(p.cfg.Images, req.Image) {
			return Info{}, false, nil
		}
		mine, err1 := m.cfg.Images.As(req.Owner).Get(req.Image)
		pub, err2 := m.cfg.Images.As(poolOwner).Get(req.Image)
		if err1 != nil || err2 != nil || mine.Digest != pub.Digest {
			return Info{}, false, nil
		}
		key, digest = imageKeyPrefix+req.Image, pub.Digest
	}
	sb, stale := p.take(key, digest)
	for _, s := range stale {
		m.finish(s, store.StateKilled, "pool: its image was imported again")
		p.release()
	}
	if len(stale) > 0 {
		p.kick()
	}
	if sb == nil {
		return Info{}, false, nil
	}
	// The refill waits a moment: starting a sandbox (the clone and
	// mount work in this process, the agent's start before its weight
	// is lowered) beside the taker's first commands made a first Python
	// cell take 20-27 ms instead of 5 (docs/benchmarks.md).
	time.AfterFunc(poolRefillDelay, p.kick)
	if err := sb.background(false); err != nil {
		// It would run at a fraction of a fresh sandbox's CPU share: give
		// it up and let the caller create one instead.
		m.cfg.Logf("pool: sandbox %s: restoring its CPU weight: %v (creating a fresh sandbox)", sb.ID, err)
		m.finish(sb, store.StateKilled, "pool: restoring CPU weight failed")
		p.release()
		return Info{}, false, nil
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.finish(sb, store.StateKilled, "server shutting down")
		p.release()
		return Info{}, true, ErrClosed
	}
	if req.OwnerLimit > 0 && m.perOwner[req.Owner] >= req.OwnerLimit {
		m.mu.Unlock()
		p.mu.Lock()
		p.idle[key] = append([]*Sandbox{sb}, p.idle[key]...)
		if digest != "" {
			p.digest[sb] = digest
		}
		p.mu.Unlock()
		return Info{}, true, fmt.Errorf("%w: this API key may run at most %d sandboxes", ErrLimit, req.OwnerLimit)
	}
	// The pool's slot becomes the owner's.
	m.pending--
	if m.perOwner[poolOwner]--; m.perOwner[poolOwner] <= 0 {
		delete(m.perOwner, poolOwner)
	}
	m.perOwner[req.Owner]++
	now := time.Now().UTC()
	sb.mu.Lock()
	sb.rec.Owner, sb.rec.Metadata = req.Owner, maps.Clone(req.Metadata)
	sb.rec.CreatedAt, sb.rec.ExpiresAt = now, now.Add(ttl)
	rec := sb.rec
	sb.mu.Unlock()
	m.live[sb.ID] = sb
	m.mu.Unlock()
	if err := m.st.PutSandbox(ctx, &rec); err != nil {
		m.finish(sb, store.StateKilled, "create failed: "+err.Error())
		m.count(func(c *Counters) { c.CreateErrors++ })
		return Info{}, true, fmt.Errorf("manager: record sandbox: %w", err)
	}
	go m.watch(sb)
	m.count(func(c *Counters) { c.Created++ })
	m.Audit(ctx, req.Owner, sb.ID, store.ActionSandboxCreate, map[string]any{
		"profile": rec.Profile, "metadata": req.Metadata, "timeout_s": ttl.Seconds(), "pooled": true,
		"warm_python": p.cfg.WarmPython && req.Image == "", "image": req.Image})
	return sb.info(), true, nil
}

// background lowers (on) or restores (off) the sandbox's CPU weight
// against the other sandboxes, where its runtime has one (native).
func (s *Sandbox) background(on bool) error {
	if b, ok := s.inst.(tier.Backgrounder); ok {
		return b.SetBackground(on)
	}
	return nil
}
