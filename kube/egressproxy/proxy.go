// Package egressproxy is airlock's egress proxy for sandboxes that run as
// Kubernetes pods (`airlock egress-proxy`, a Deployment).
//
// A NetworkPolicy (NetworkPolicies) lets a sandbox pod reach nothing but
// this proxy. The proxy applies the same allowlist and credential injection
// as the single-node proxy (package egress): it is an egress.Proxy whose
// sandboxes are learned from the Kubernetes API instead of registered by a
// local manager. A connection is attributed to a sandbox by its source
// address, the pod IP: the proxy watches the pods labelled
// airlock.dev/sandbox (Watch), reads each one's policy from the annotation
// airlock.dev/network (JSON of policy.Network) and its injected headers from
// the Secret "airlock-<id>-egress" (EgressSecretData), and maps the pod's IP
// to the sandbox only while the pod is Running and not being deleted. An IP
// claimed by two live pods at once (a reuse the watch has not caught up
// with) is refused outright, never guessed.
package egressproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/policy"
)

// Labels, annotations and Secret keys of the Kubernetes contract.
const (
	// LabelSandbox carries the sandbox id on its pod and Secrets.
	LabelSandbox = "airlock.dev/sandbox"
	// LabelPurpose marks the egress Secret (value PurposeEgress); the proxy
	// watches only Secrets with it, never the agents' TLS Secrets.
	LabelPurpose = "airlock.dev/purpose"
	// PurposeEgress is LabelPurpose's value on egress Secrets.
	PurposeEgress = "egress"
	// AnnotationNetwork holds the JSON of the sandbox's policy.Network.
	AnnotationNetwork = "airlock.dev/network"
	// SecretsKey holds the JSON array of egress.Secret in the egress Secret.
	SecretsKey = "secrets.json"
	// CACertKey and CAKeyKey hold the sandbox's interception CA (PEM) in
	// the egress Secret; the pod trusts ca.crt.
	CACertKey = "ca.crt"
	CAKeyKey  = "ca.key"
)

// Default ports of the proxy's listeners.
const (
	HTTPPort  = 3128
	SOCKSPort = 1080
)

// EgressSecretName is the name of sandbox id's egress Secret.
func EgressSecretName(id string) string { return "airlock-" + id + "-egress" }

// EgressSecretData builds the data of sandbox id's egress Secret: the
// headers to inject and a new interception CA constrained to their hosts.
// Label the Secret LabelSandbox=id and LabelPurpose=PurposeEgress, and put
// data[CACertKey] (never data[CAKeyKey]) in the pod's trust store.
func EgressSecretData(id string, secrets []egress.Secret) (map[string][]byte, error) {
	ca, err := egress.NewSandboxCA(id, secrets, 0)
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(secrets)
	if err != nil {
		return nil, fmt.Errorf("egressproxy: encode secrets of %q: %w", id, err)
	}
	return map[string][]byte{SecretsKey: js, CACertKey: ca.CertPEM, CAKeyKey: ca.KeyPEM}, nil
}

// Config configures a Server.
type Config struct {
	// Egress configures the underlying proxy (resolver, upstream roots,
	// limits, logger, OnConnection).
	Egress egress.Config
}

// Server is the cluster egress proxy: an egress.Proxy plus the map from
// pod IPs to sandboxes. It is safe for concurrent use.
type Server struct {
	p   *egress.Proxy
	log *slog.Logger

	mu     sync.Mutex
	pods   map[types.UID]*podEntry // live sandbox pods
	byIP   map[netip.Addr][]*podEntry
	byID   map[string]*podEntry // the pod registered for each sandbox
	closed bool
}

// podEntry is one sandbox pod as the proxy knows it.
type podEntry struct {
	uid     types.UID
	id      string
	ips     []netip.Addr
	network string // the annotation as read
	secret  string // the egress Secret's resourceVersion ("" without one)
	bad     bool   // its configuration was refused: registered deny-all
}

// New returns a Server knowing no pods.
func New(cfg Config) *Server {
	log := cfg.Egress.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Server{
		p:    egress.New(cfg.Egress),
		log:  log,
		pods: make(map[types.UID]*podEntry),
		byIP: make(map[netip.Addr][]*podEntry),
		byID: make(map[string]*podEntry),
	}
}

// Close stops every listener and connection.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return s.p.Close()
}

// eligible reports whether pod's IPs may identify its sandbox: a sandbox
// pod that runs, has an IP and is not being deleted. Every IP of a
// dual-stack pod counts.
func eligible(pod *corev1.Pod) (id string, ips []netip.Addr, ok bool) {
	id = pod.Labels[LabelSandbox]
	if id == "" || pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return "", nil, false
	}
	for _, s := range append([]string{pod.Status.PodIP}, podIPs(pod)...) {
		if ip, err := netip.ParseAddr(s); err == nil && !slices.Contains(ips, ip.Unmap()) {
			ips = append(ips, ip.Unmap())
		}
	}
	return id, ips, len(ips) > 0
}

func podIPs(pod *corev1.Pod) []string {
	var out []string
	for _, p := range pod.Status.PodIPs {
		out = append(out, p.IP)
	}
	return out
}

// SyncPod brings the proxy in line with pod and its egress Secret (nil if
// it has none): registers the sandbox, updates its policy, or forgets the
// pod when it no longer runs. A malformed annotation or Secret registers
// the sandbox with everything denied (fail closed) and returns the error.
func (s *Server) SyncPod(pod *corev1.Pod, secret *corev1.Secret) error {
	id, ips, ok := eligible(pod)
	if !ok {
		s.ForgetPod(pod.UID)
		return nil
	}
	e := &podEntry{uid: pod.UID, id: id, ips: ips, network: pod.Annotations[AnnotationNetwork]}
	if secret != nil {
		e.secret = secret.ResourceVersion
	}
	sb, cfgErr := sandboxConfig(id, e.network, secret)
	if cfgErr != nil {
		sb = egress.Sandbox{Policy: egress.Policy{Mode: string(policy.NetNone)}}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return egress.ErrClosed
	}
	if old := s.pods[e.uid]; old != nil {
		s.unindex(old)
	}
	cur := s.byID[id]
	// Same pod, same secrets: only the policy may have changed, and
	// established connections go on. Otherwise (a new pod for the sandbox,
	// new secrets, a configuration error) start over, closing the old
	// connections.
	same := cur != nil && cur.uid == e.uid && cur.secret == e.secret && !cur.bad && cfgErr == nil
	if !same || s.p.SetPolicy(id, sb.Policy) != nil {
		s.p.RemoveSandbox(id)
		if cur != nil && cur.uid != e.uid {
			s.unindex(cur)
		}
		if err := s.p.AddSandbox(id, sb); err != nil {
			if errors.Is(err, egress.ErrClosed) {
				return err
			}
			cfgErr = err
			s.p.AddSandbox(id, egress.Sandbox{Policy: egress.Policy{Mode: string(policy.NetNone)}})
		}
	}
	e.bad = cfgErr != nil
	s.pods[e.uid] = e
	s.byID[id] = e
	for _, ip := range ips {
		s.byIP[ip] = append(s.byIP[ip], e)
		if len(s.byIP[ip]) > 1 {
			s.log.Warn("egress-proxy: two live pods claim one IP; refusing its connections until one is gone", "ip", ip.String())
		}
	}
	if cfgErr != nil {
		s.log.Error("egress-proxy: sandbox configuration refused, denying all its egress", "sandbox", id, "err", cfgErr)
	}
	return cfgErr
}

// ForgetPod drops a pod: its IP no longer identifies anything and, if it
// was its sandbox's registered pod, the sandbox is forgotten and its
// connections closed.
func (s *Server) ForgetPod(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.pods[uid]
	if e == nil {
		return
	}
	s.unindex(e)
	if s.byID[e.id] == e {
		delete(s.byID, e.id)
		s.p.RemoveSandbox(e.id)
	}
}

// unindex removes e from the pod and IP maps.
func (s *Server) unindex(e *podEntry) {
	delete(s.pods, e.uid)
	for _, ip := range e.ips {
		list := slices.DeleteFunc(slices.Clone(s.byIP[ip]), func(x *podEntry) bool { return x == e })
		if len(list) == 0 {
			delete(s.byIP, ip)
		} else {
			s.byIP[ip] = list
		}
	}
}

// Lookup returns the sandbox that addr (a connection's source IP) belongs
// to, or a reason why none does.
func (s *Server) Lookup(addr netip.Addr) (id string, reason string) {
	addr = addr.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.byIP[addr]
	switch {
	case len(list) == 0:
		return "", fmt.Sprintf("no running sandbox pod has the IP %s", addr)
	case len(list) > 1:
		return "", fmt.Sprintf("the IP %s is claimed by %d live pods (an IP reuse not yet settled)", addr, len(list))
	case s.byID[list[0].id] != list[0]:
		return "", fmt.Sprintf("the pod at %s is not its sandbox's current pod", addr)
	}
	return list[0].id, ""
}

// sandboxConfig reads a sandbox's policy annotation and egress Secret.
func sandboxConfig(id, annotation string, secret *corev1.Secret) (egress.Sandbox, error) {
	var sb egress.Sandbox
	n := policy.Network{Mode: policy.NetNone}
	if annotation != "" {
		if err := json.Unmarshal([]byte(annotation), &n); err != nil {
			return sb, fmt.Errorf("sandbox %q: annotation %s: %w", id, AnnotationNetwork, err)
		}
	}
	if n.Mode == "" {
		n.Mode = policy.NetNone
	}
	sb.Policy = egress.Policy{Mode: string(n.Mode), Allow: n.Allow, Deny: n.Deny}
	if err := sb.Policy.Validate(); err != nil {
		return sb, fmt.Errorf("sandbox %q: annotation %s: %w", id, AnnotationNetwork, err)
	}
	if secret == nil {
		return sb, nil
	}
	if err := json.Unmarshal(secret.Data[SecretsKey], &sb.Secrets); err != nil {
		// The error of encoding/json can quote input: name the key only.
		return sb, fmt.Errorf("sandbox %q: Secret %s: %s is not a JSON array of secrets", id, secret.Name, SecretsKey)
	}
	if len(sb.Secrets) > 0 {
		if len(secret.Data[CACertKey]) == 0 || len(secret.Data[CAKeyKey]) == 0 {
			return sb, fmt.Errorf("sandbox %q: Secret %s lacks %s or %s", id, secret.Name, CACertKey, CAKeyKey)
		}
		sb.CA = &egress.SandboxCA{CertPEM: secret.Data[CACertKey], KeyPEM: secret.Data[CAKeyKey]}
	}
	return sb, nil
}

// Serve accepts connections on l, attributes each to a sandbox by its
// source IP and serves it as kind (egress.HTTP or egress.SOCKS5). A
// connection from an unknown IP is refused with the reason (an HTTP 403 or
// a SOCKS5 failure). It returns nil when l is closed; other accept errors
// (out of file descriptors) are logged and retried with a backoff.
func (s *Server) Serve(l net.Listener, kind egress.Kind) error {
	backoff := 5 * time.Millisecond
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.log.Warn("egress-proxy: accept", "kind", kind.String(), "err", err)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		go s.serveConn(c, kind)
	}
}

func (s *Server) serveConn(c net.Conn, kind egress.Kind) {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		c.Close()
		return
	}
	id, reason := s.Lookup(ap.Addr())
	if id == "" {
		s.log.Info("egress-proxy: refused a connection from an unknown source", "source", ap.Addr().String(), "reason", reason)
		// An id no sandbox has: the proxy refuses with its reason, naming it.
		id = "unknown source " + ap.Addr().String()
	}
	s.p.ServeConn(context.Background(), id, c, kind)
}

// Proxy returns the underlying egress proxy (for its CA and counters).
func (s *Server) Proxy() *egress.Proxy { return s.p }
