package manager

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/tier"
	"github.com/airlock-dev/airlock/store"
)

// Network egress.
//
// Every sandbox keeps its own empty network namespace. For a sandbox whose
// network mode is not none, the manager opens two listening sockets inside
// that namespace (native.Config.Listen, or native.ListenIn for a sandbox
// that already runs) at ProxyHTTPAddr and ProxySOCKSAddr; they belong to
// this process and are served by one egress.Proxy shared by all sandboxes.
// Nothing else in the namespace leads anywhere.
//
// The proxy variables (egress.ProxyEnv) are in the environment of every
// sandbox the manager creates, whatever its mode, so that a sandbox switched
// from none to allowlist while it runs works for processes that already
// run. In mode none nothing listens on those ports: a program that tries
// gets "connection refused", and no host code is reachable from inside.
// Switching a running sandbox to allowlist or open opens the listeners;
// switching back to none keeps them, and the proxy refuses everything with
// a reason.
//
// Secret values live only in the proxy's memory. They are not in the
// stored policy, the runtime state or the audit log (only their hosts and
// header names are). After a server restart, a reattached sandbox keeps its
// policy but its secrets are no longer injected (NetworkInfo.SecretsLost).

// Addresses of the proxy listeners inside a sandbox.
const (
	ProxyHTTPAddr  = "127.0.0.1:3128"
	ProxySOCKSAddr = "127.0.0.1:1080"
	proxyHTTPPort  = 3128
	proxySOCKSPort = 1080
)

// Paths of the trust store files inside a sandbox with secrets.
const (
	// CABundlePath is the host's CA bundle plus the sandbox's egress CA,
	// bound read-only over the copy of the host's bundle.
	CABundlePath = "/etc/ssl/certs/ca-certificates.crt"
	// CAPath is the sandbox's egress CA alone (NODE_EXTRA_CA_CERTS).
	CAPath = "/etc/airlock/egress-ca.pem"
)

// Caps on a network policy and secrets given through the API.
const (
	maxNetEntries = 1024
	maxSecrets    = 32
	maxSecretLen  = 16 << 10
)

// ErrNetwork is returned (wrapped) when a sandbox's proxy listeners cannot
// be opened, e.g. because a program inside already listens on 3128.
var ErrNetwork = errors.New("sandbox network unavailable")

// EgressConfig configures the egress proxy shared by a manager's
// sandboxes. The zero value uses the system resolver and roots.
type EgressConfig struct {
	// Resolver resolves destination names; nil means the system resolver.
	Resolver egress.Resolver
	// RootCAs verifies upstream servers before a secret is sent to them;
	// nil means the system roots.
	RootCAs *x509.CertPool
	// Limits are each sandbox's caps on concurrent connections and bytes;
	// zero fields mean no cap.
	Limits egress.Limits
	// HostCABundle is the host's trust store that a sandbox with secrets
	// gets together with its own CA; "" means CABundlePath on the host.
	HostCABundle string
	// Logger receives the proxy's denials (Info) and connections (Debug);
	// nil means slog.Default().
	Logger *slog.Logger
}

// SecretRef names an injected header without its value.
type SecretRef struct {
	Host   string `json:"host"`
	Header string `json:"header"`
}

// NetworkInfo is a sandbox's network policy and proxy state.
type NetworkInfo struct {
	// Mode, Allow and Deny are the policy in force.
	Mode  string   `json:"mode"`
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
	// Secrets names the injected headers (never their values).
	Secrets []SecretRef `json:"secrets,omitempty"`
	// SecretsLost is true when the server restarted since the sandbox was
	// created: secret values are kept in memory only, so they are no longer
	// injected. Recreate the sandbox to inject them again.
	SecretsLost bool `json:"secrets_lost,omitempty"`
	// Listening says whether the proxy listens inside the sandbox (at
	// 127.0.0.1:3128 for HTTP and 127.0.0.1:1080 for SOCKS5).
	Listening bool `json:"listening"`
}

// Connection is one entry of a sandbox's network log.
type Connection struct {
	Time       time.Time `json:"time"`
	Host       string    `json:"host"`
	Port       int       `json:"port"`
	Allowed    bool      `json:"allowed"`
	Reason     string    `json:"reason"`
	BytesUp    int64     `json:"bytes_up"`
	BytesDown  int64     `json:"bytes_down"`
	DurationMS int64     `json:"duration_ms"`
}

// netState is a sandbox's egress state, guarded by mu.
type netState struct {
	mu          sync.Mutex
	network     policy.Network
	registered  bool // known to the proxy
	listeners   []net.Listener
	secrets     []SecretRef
	secretsLost bool
	ended       bool
}

// openEgress creates the shared proxy.
func (m *Manager) openEgress() {
	c := m.cfg.Egress
	m.connSem = make(chan struct{}, 256)
	m.egress = egress.New(egress.Config{Resolver: c.Resolver, RootCAs: c.RootCAs, Limits: c.Limits,
		Logger: c.Logger, OnConnection: m.logConnection})
}

// closeEgress closes the proxy (every listener and connection) and waits
// for the network log to be written.
func (m *Manager) closeEgress() {
	m.egress.Close()
	m.connWG.Wait()
}

// logConnection writes a proxy record to the network log in the
// background. At most cap(connSem) writes are in flight; beyond that the
// finished connection's goroutine waits, so a slow store slows the proxy
// rather than losing records.
func (m *Manager) logConnection(r egress.Record) {
	m.observeEgress(r)
	if !r.Allowed {
		m.anomalies.countEgressDenied(r.SandboxID)
	}
	if dropped, ok := m.netLogAllow(r.SandboxID); !ok {
		return
	} else if dropped > 0 {
		r.Reason = fmt.Sprintf("%s (%d earlier records of this sandbox dropped by the log rate limit)", r.Reason, dropped)
	}
	m.connSem <- struct{}{}
	m.connWG.Add(1)
	go func() {
		defer func() { <-m.connSem; m.connWG.Done() }()
		c := store.Connection{SandboxID: r.SandboxID, Time: r.Time, Host: r.Host, Port: r.Port, Allowed: r.Allowed,
			Reason: r.Reason, BytesUp: r.BytesUp, BytesDown: r.BytesDown, Duration: r.Duration}
		if err := m.st.LogConnection(context.Background(), c); err != nil {
			m.cfg.Logf("sandbox %s: network log: %v", r.SandboxID, err)
		}
	}()
}

// toEgress converts a policy's network section for the proxy.
func toEgress(n policy.Network) egress.Policy {
	return egress.Policy{Mode: string(n.Mode), Allow: n.Allow, Deny: n.Deny}
}

// checkNetwork validates a network policy from a client and normalizes an
// empty mode to none.
func checkNetwork(n policy.Network) (policy.Network, error) {
	if n.Mode == "" {
		n.Mode = policy.NetNone
	}
	switch n.Mode {
	case policy.NetNone, policy.NetAllowlist, policy.NetOpen:
	default:
		return n, fmt.Errorf("%w: network.mode: unknown mode %q (want none, allowlist or open)", ErrPolicy, n.Mode)
	}
	if len(n.Allow) > maxNetEntries || len(n.Deny) > maxNetEntries {
		return n, fmt.Errorf("%w: network: at most %d allow and %d deny entries", ErrPolicy, maxNetEntries, maxNetEntries)
	}
	if err := toEgress(n).Validate(); err != nil {
		return n, fmt.Errorf("%w: %s", ErrPolicy, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return n, nil
}

// applyNetwork puts the request's network policy and the proxy
// environment into p. Secrets are checked by the proxy when the sandbox is
// registered (netPrepare); here only their number and size.
func applyNetwork(p *policy.Policy, req *CreateRequest) error {
	n, err := checkNetwork(req.Network)
	if err != nil {
		return err
	}
	if len(req.Secrets) > maxSecrets {
		return fmt.Errorf("%w: at most %d secrets", ErrPolicy, maxSecrets)
	}
	for i, s := range req.Secrets {
		if len(s.Host)+len(s.Header)+len(s.Value) > maxSecretLen {
			return fmt.Errorf("%w: secrets[%d] (host %q) is longer than %d bytes", ErrPolicy, i, s.Host, maxSecretLen)
		}
	}
	p.Network = n
	for _, kv := range egress.ProxyEnv(proxyHTTPPort, proxySOCKSPort) {
		k, v, _ := strings.Cut(kv, "=")
		p.SetEnv(k, v)
	}
	if len(req.Secrets) > 0 {
		for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"} {
			p.SetEnv(k, CABundlePath)
		}
		p.SetEnv("NODE_EXTRA_CA_CERTS", CAPath)
	}
	return nil
}

// secretRefs returns the hosts and headers of secrets, without values.
func secretRefs(secrets []egress.Secret) []SecretRef {
	var refs []SecretRef
	for _, s := range secrets {
		refs = append(refs, SecretRef{Host: s.Host, Header: s.Header})
	}
	return refs
}

// netSetup is what netPrepare decided for a new sandbox.
type netSetup struct {
	listen []string
	refs   []SecretRef
}

// netPrepare registers a new sandbox with the proxy when it needs it
// (mode not none, or secrets) and, with secrets, writes its trust store
// files into its state directory dir and binds them into p. The caller
// calls m.egress.RemoveSandbox(id) if the sandbox then fails to start.
func (m *Manager) netPrepare(id, dir string, req *CreateRequest, p *policy.Policy) (netSetup, error) {
	var ns netSetup
	if p.Network.Mode == policy.NetNone && len(req.Secrets) == 0 {
		return ns, nil
	}
	if err := m.egress.AddSandbox(id, egress.Sandbox{Policy: toEgress(p.Network), Secrets: req.Secrets}); err != nil {
		if errors.Is(err, egress.ErrClosed) {
			return ns, ErrClosed
		}
		return ns, fmt.Errorf("%w: %s", ErrPolicy, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if len(req.Secrets) > 0 {
		mounts, err := m.writeTrust(id, dir)
		if err != nil {
			m.egress.RemoveSandbox(id)
			return ns, err
		}
		p.Filesystem.Mounts = append(p.Filesystem.Mounts, mounts...)
		ns.refs = secretRefs(req.Secrets)
	}
	if p.Network.Mode != policy.NetNone {
		ns.listen = []string{ProxyHTTPAddr, ProxySOCKSAddr}
	}
	return ns, nil
}

// writeTrust writes the sandbox's CA alone and combined with the host's
// bundle into dir and returns the read-only mounts that place them.
func (m *Manager) writeTrust(id, dir string) ([]policy.Mount, error) {
	ca := m.egress.CACertPEM(id)
	hostBundle := m.cfg.Egress.HostCABundle
	if hostBundle == "" {
		hostBundle = CABundlePath
	}
	bundle, err := os.ReadFile(hostBundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("manager: read host CA bundle: %w", err)
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	bundle = append(bundle, ca...)
	caFile, bundleFile := filepath.Join(dir, "egress-ca.pem"), filepath.Join(dir, "ca-certificates.crt")
	for f, data := range map[string][]byte{caFile: ca, bundleFile: bundle} {
		if err := os.WriteFile(f, data, 0o644); err != nil {
			return nil, fmt.Errorf("manager: write sandbox trust store: %w", err)
		}
	}
	return []policy.Mount{{Source: bundleFile, Target: CABundlePath}, {Source: caFile, Target: CAPath}}, nil
}

// netStart records a started sandbox's egress state and serves its
// listeners (HTTP then SOCKS5, as in netSetup.listen).
func (m *Manager) netStart(sb *Sandbox, n policy.Network, ns netSetup, ls []net.Listener) {
	sb.net.mu.Lock()
	defer sb.net.mu.Unlock()
	sb.net.network = n
	sb.net.registered = n.Mode != policy.NetNone || len(ns.refs) > 0
	sb.net.secrets = ns.refs
	sb.net.listeners = ls
	m.serveProxy(sb.ID, ls)
}

// serveProxy serves listeners opened for the addresses ProxyHTTPAddr and
// ProxySOCKSAddr, in that order.
func (m *Manager) serveProxy(id string, ls []net.Listener) {
	for i, l := range ls {
		kind := egress.HTTP
		if i == 1 {
			kind = egress.SOCKS5
		}
		go m.egress.Serve(l, id, kind)
	}
}

// netEnd closes a sandbox's listeners and connections and forgets it in
// the proxy.
func (m *Manager) netEnd(sb *Sandbox) {
	sb.net.mu.Lock()
	defer sb.net.mu.Unlock()
	sb.net.ended = true
	for _, l := range sb.net.listeners {
		l.Close()
	}
	sb.net.listeners = nil
	if sb.net.registered {
		m.egress.RemoveSandbox(sb.ID)
		sb.net.registered = false
	}
}

// netReattach restores the egress of a sandbox reattached after a restart:
// its stored policy, new listeners inside its namespace. Its secrets, if it
// had any, are lost. Failures are logged: the sandbox then has no network.
func (m *Manager) netReattach(sb *Sandbox, refs []SecretRef) {
	var p policy.Policy
	if len(sb.rec.Policy) > 0 {
		if err := json.Unmarshal(sb.rec.Policy, &p); err != nil {
			m.cfg.Logf("sandbox %s: stored policy: %v; network mode none", sb.ID, err)
		}
	}
	n, err := checkNetwork(p.Network)
	if err != nil {
		m.cfg.Logf("sandbox %s: stored network policy: %v; network mode none", sb.ID, err)
		n = policy.Network{Mode: policy.NetNone}
	}
	sb.net.mu.Lock()
	defer sb.net.mu.Unlock()
	sb.net.network = n
	sb.net.secrets = refs
	sb.net.secretsLost = len(refs) > 0
	if len(refs) > 0 {
		m.cfg.Logf("sandbox %s: reattached without its %d secret(s): their values were only in the previous server's memory", sb.ID, len(refs))
	}
	if n.Mode == policy.NetNone {
		return
	}
	if err := m.egress.AddSandbox(sb.ID, egress.Sandbox{Policy: toEgress(n)}); err != nil {
		m.cfg.Logf("sandbox %s: egress: %v", sb.ID, err)
		return
	}
	sb.net.registered = true
	ls, ok := instListeners(sb) // an adopted paused sandbox's, in its new namespace
	var lerr error
	if !ok {
		ls, lerr = instListenIn(sb.inst, []string{ProxyHTTPAddr, ProxySOCKSAddr})
	}
	if lerr != nil {
		m.cfg.Logf("sandbox %s: egress listeners: %v; the sandbox has no network until its policy is set again", sb.ID, lerr)
		return
	}
	sb.net.listeners = ls
	m.serveProxy(sb.ID, ls)
}

// networkInfo describes sb's network; the caller holds sb.net.mu.
func (sb *Sandbox) networkInfo() NetworkInfo {
	n := sb.net.network
	return NetworkInfo{Mode: string(n.Mode), Allow: nonNil(n.Allow), Deny: nonNil(n.Deny),
		Secrets: sb.net.secrets, SecretsLost: sb.net.secretsLost, Listening: len(sb.net.listeners) > 0}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// SetNetwork replaces a running sandbox's network policy. The next
// connection (and the next request on an HTTP keep-alive connection) is
// judged by it; open tunnels keep going. Switching from none opens the
// proxy listeners inside the sandbox. The change is stored and audited
// (network.change).
func (m *Manager) SetNetwork(ctx context.Context, owner, id string, n policy.Network) (NetworkInfo, error) {
	n, err := checkNetwork(n)
	if err != nil {
		return NetworkInfo{}, err
	}
	sb, err := m.lookupAny(owner, id)
	if err != nil {
		return NetworkInfo{}, err
	}
	sb.net.mu.Lock()
	defer sb.net.mu.Unlock()
	if sb.net.ended {
		return NetworkInfo{}, fmt.Errorf("%w: ended", ErrNotRunning)
	}
	old := sb.net.network
	if n.Mode != policy.NetNone && len(sb.net.listeners) == 0 {
		// A tier whose network namespace is out of the host's reach (gVisor's
		// netstack): opening listeners by its pid would open them in the host's.
		if t, err := tier.Lookup(sb.runtime()); err != nil || !t.Caps().AttachNetwork {
			if err != nil {
				return NetworkInfo{}, fmt.Errorf("%w: %w", ErrPolicy, err)
			}
			return NetworkInfo{}, refuse(t, "a network given to a sandbox created with network none (create it with one)", "attach_network")
		}
	}
	added := false
	if sb.net.registered {
		if err := m.egress.SetPolicy(id, toEgress(n)); err != nil {
			return NetworkInfo{}, fmt.Errorf("manager: set network of %s: %w", id, err)
		}
	} else {
		if err := m.egress.AddSandbox(id, egress.Sandbox{Policy: toEgress(n)}); err != nil {
			if errors.Is(err, egress.ErrClosed) {
				return NetworkInfo{}, ErrClosed
			}
			return NetworkInfo{}, fmt.Errorf("manager: set network of %s: %w", id, err)
		}
		sb.net.registered, added = true, true
	}
	if n.Mode != policy.NetNone && len(sb.net.listeners) == 0 {
		ls, err := instListenIn(sb.inst, []string{ProxyHTTPAddr, ProxySOCKSAddr})
		if err != nil {
			if added {
				m.egress.RemoveSandbox(id)
				sb.net.registered = false
			} else {
				m.egress.SetPolicy(id, toEgress(old))
			}
			return NetworkInfo{}, fmt.Errorf("%w: %w (a program in the sandbox may be listening on 127.0.0.1:3128 or 1080)", ErrNetwork, err)
		}
		sb.net.listeners = ls
		m.serveProxy(id, ls)
	}
	sb.net.network = n

	sb.mu.Lock()
	var p policy.Policy
	if len(sb.rec.Policy) > 0 {
		_ = json.Unmarshal(sb.rec.Policy, &p)
	}
	p.Network = n
	raw, err := json.Marshal(p)
	if err == nil {
		sb.rec.Policy = raw
	}
	sb.mu.Unlock()
	if err == nil {
		err = m.st.SetSandboxPolicy(ctx, id, raw)
	}
	if err != nil {
		m.cfg.Logf("sandbox %s: store network policy: %v", id, err)
	}
	m.Audit(ctx, owner, id, store.ActionNetworkChange, map[string]any{"from": old, "to": n})
	return sb.networkInfo(), nil
}

// runtime is the runtime the sandbox runs under, from its record (decoded
// once: every exec asks, for the OOM counter).
func (sb *Sandbox) runtime() policy.Runtime {
	if n := sb.runtimeName(); n != "" {
		return policy.Runtime(n)
	}
	return policy.RuntimeNative
}

// Network describes a sandbox's network policy: the one in force for a
// running sandbox, the last stored one for an ended sandbox.
func (m *Manager) Network(ctx context.Context, owner, id string) (NetworkInfo, error) {
	if m.remote() {
		return m.networkRemote(ctx, owner, id)
	}
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb != nil && sb.rec.Owner == owner {
		sb.net.mu.Lock()
		defer sb.net.mu.Unlock()
		return sb.networkInfo(), nil
	}
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return NetworkInfo{}, ErrNotFound
		}
		return NetworkInfo{}, fmt.Errorf("manager: network of %s: %w", id, err)
	}
	if rec.Owner != owner {
		return NetworkInfo{}, ErrNotFound
	}
	var p policy.Policy
	if len(rec.Policy) > 0 {
		_ = json.Unmarshal(rec.Policy, &p)
	}
	n := p.Network
	if n.Mode == "" {
		n.Mode = policy.NetNone
	}
	return NetworkInfo{Mode: string(n.Mode), Allow: nonNil(n.Allow), Deny: nonNil(n.Deny)}, nil
}

// NetworkLog returns the newest limit entries (0: all) of a sandbox's
// network log, newest first: every connection and refused attempt through
// the proxy. It works for ended sandboxes too.
func (m *Manager) NetworkLog(ctx context.Context, owner, id string, limit int) ([]Connection, error) {
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	cs, err := m.st.Connections(ctx, id, limit)
	if err != nil {
		return nil, fmt.Errorf("manager: network log of %s: %w", id, err)
	}
	out := make([]Connection, len(cs))
	for i, c := range cs {
		out[i] = Connection{Time: c.Time, Host: c.Host, Port: c.Port, Allowed: c.Allowed, Reason: c.Reason,
			BytesUp: c.BytesUp, BytesDown: c.BytesDown, DurationMS: c.Duration.Milliseconds()}
	}
	return out, nil
}

// Network log rate limit per sandbox: a hostile program looping on refused
// connections must not grow the store without bound. Records beyond the
// rate are counted, and the count is noted on the next record written.
const (
	netLogRate  = 50   // records per second, sustained
	netLogBurst = 2000 // records at once
)

type netLogBucket struct {
	lim     *rate.Limiter
	dropped int64
	seen    time.Time
}

// netLogAllow reports whether a record of sandbox id may be written now and
// how many were dropped before it.
func (m *Manager) netLogAllow(id string) (dropped int64, ok bool) {
	m.netLogMu.Lock()
	defer m.netLogMu.Unlock()
	if m.netLog == nil {
		m.netLog = map[string]*netLogBucket{}
	}
	now := time.Now()
	b := m.netLog[id]
	if b == nil {
		if len(m.netLog) > 4096 { // forget idle sandboxes' buckets
			for k, v := range m.netLog {
				if now.Sub(v.seen) > time.Minute {
					delete(m.netLog, k)
				}
			}
		}
		b = &netLogBucket{lim: rate.NewLimiter(netLogRate, netLogBurst)}
		m.netLog[id] = b
	}
	b.seen = now
	if !b.lim.AllowN(now, 1) {
		b.dropped++
		return 0, false
	}
	dropped, b.dropped = b.dropped, 0
	return dropped, true
}
