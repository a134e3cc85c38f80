// Package kube runs airlock's sandboxes as pods of a Kubernetes cluster: a
// manager.Backend whose sandboxes are agent-sandbox Sandbox objects
// (agents.x-k8s.io/v1beta1, sigs.k8s.io/agent-sandbox), created and read
// with controller-runtime's client.
//
// Each sandbox is a Sandbox named by its id, in the server's namespace,
// whose pod template is the policy mapped to a pod (pod.go): resources,
// a locked-down securityContext, the tier's RuntimeClass, an init container
// that copies the static airlock binary into an emptyDir, and the agent as
// the main container's command, listening on AgentPort with TLS and a
// token from the sandbox's Secret (package agenttls). Its TTL is the
// Sandbox's shutdownTime (shutdownPolicy Delete: agent-sandbox's controller
// deletes it, and the Secret goes with it by owner reference); pause is
// operatingMode Suspended (the pod is deleted: processes and files outside
// volumes are lost), resume Running.
//
// The Kubernetes API is the state of record: labels and annotations on the
// Sandbox say whose it is and what it was made with, so any number of
// servers share the sandboxes, and a server that has no connection to a
// sandbox's agent dials it when first asked (Connect).
//
// With Config.Pool, creates of a pooled profile are SandboxClaims on a
// SandboxWarmPool instead, whose pods' agents the server enrolls after the
// claim (pool.go); the claim is then the sandbox's record.
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/internal/spans"
	"github.com/airlock-dev/airlock/kube/agenttls"
	"github.com/airlock-dev/airlock/kube/egressproxy"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/tier"
	"github.com/airlock-dev/airlock/store"
)

// Runtimes (isolation tiers) a Backend may offer. Native is the cluster's
// default container runtime (runc: namespaces, seccomp, cgroups).
const (
	RuntimeNative  = "native"
	RuntimeGVisor  = "gvisor"
	RuntimeMicroVM = "microvm"
)

// DefaultRuntimeClasses maps tiers to the RuntimeClass names clusters
// usually give them; Config.RuntimeClasses overrides it.
var DefaultRuntimeClasses = map[string]string{RuntimeGVisor: "gvisor", RuntimeMicroVM: "kata"}

// Config configures a Backend.
type Config struct {
	// Client talks to the API server; NewClient makes one.
	Client client.Client
	// Namespace holds the sandboxes, their Secrets and the CA Secret.
	Namespace string
	// AgentImage is an image holding the static airlock binary at
	// /airlock (AgentImageBinary). Required.
	AgentImage string
	// DefaultImage runs sandboxes created without an image. Required.
	DefaultImage string
	// RuntimeClasses maps tiers (gvisor, microvm) to RuntimeClass names;
	// nil means DefaultRuntimeClasses. Native may be mapped too (to a
	// RuntimeClass other than the cluster's default).
	RuntimeClasses map[string]string
	// EgressProxy is the host:port of the cluster's egress proxy (the
	// HTTP proxy of `airlock egress-proxy`); "" refuses sandboxes whose
	// network mode is not none.
	EgressProxy string
	// CABundle is the file of CA certificates a sandbox with injected
	// secrets trusts besides its interception CA (the server's own, which
	// the pod's image may lack); "" means /etc/ssl/certs/ca-certificates.crt.
	CABundle string
	// WaitReady makes Create wait until the sandbox's agent answers (as
	// a native create does); false returns once the objects exist.
	WaitReady bool
	// ReadyTimeout bounds WaitReady and the wait of Connect for a pod
	// still starting; 0 means 2 minutes.
	ReadyTimeout time.Duration
	// Logf logs operational events; nil discards them.
	Logf func(format string, args ...any)
	// Pool is how many pooled pods to keep warm per pooled profile
	// (pool.go; EnsurePools makes the pools); 0: no warm pool.
	Pool int
	// PoolProfiles are the pooled profiles; empty means the default
	// profile (strict).
	PoolProfiles []string
	// Reserve is how many sandboxes of each pooled profile this process
	// keeps claimed from the warm pool and enrolled ahead of creates
	// (reserve.go; StartReserve), 0 to MaxReserve; 0: none.
	Reserve int
	// ReserveLease is how long a reserved claim outlives a holder that
	// stops renewing it (killed); 0 means 2 minutes.
	ReserveLease time.Duration
}

// Backend is a manager.Backend on a Kubernetes cluster.
type Backend struct {
	cfg  Config
	c    client.Client
	port int // the agents' port (AgentPort; tests change it)

	caMu     sync.Mutex
	ca       *agenttls.CA
	enr      *agenttls.Enroller // enrolls pooled agents (pool.go)
	enrCA    *agenttls.CA       // the CA enr is of
	enrUntil time.Time          // when enr expires

	stop       chan struct{} // closed by Close: stops the sweeper
	stopOnce   sync.Once
	sweepGrace time.Duration // sweepGrace (tests change it)

	mu    sync.Mutex
	conns map[string]*conn // sandbox id -> agent connection of this process

	rmu     sync.Mutex               // guards reserve
	reserve map[string][]*reserved   // pool -> reserved sandboxes ready (reserve.go)
	rkick   map[string]chan struct{} // pool -> wakes its reserve's refill
	rwg     sync.WaitGroup           // the reserve's loops
	token   string                   // marks this process's reserved claims
}

// conn is this process's connection to a sandbox's agent.
type conn struct {
	pod    types.UID // the pod it reaches
	client *agent.Client
	pooled bool // the sandbox's record is a SandboxClaim
}

var _ manager.Backend = (*Backend)(nil)

// New checks cfg and returns a Backend.
func New(cfg Config) (*Backend, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("kube: no client")
	case cfg.Namespace == "":
		return nil, errors.New("kube: no namespace")
	case cfg.AgentImage == "":
		return nil, errors.New("kube: no agent image (--agent-image: an image holding the static airlock binary at /airlock)")
	case cfg.DefaultImage == "":
		return nil, errors.New("kube: no default image (--default-image)")
	}
	if cfg.RuntimeClasses == nil {
		cfg.RuntimeClasses = DefaultRuntimeClasses
	}
	for tier := range cfg.RuntimeClasses {
		if tier != RuntimeNative && tier != RuntimeGVisor && tier != RuntimeMicroVM {
			return nil, fmt.Errorf("kube: runtime class for unknown tier %q (want native, gvisor or microvm)", tier)
		}
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 2 * time.Minute
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Pool < 0 {
		return nil, errors.New("kube: negative pool size")
	}
	if cfg.Reserve < 0 || cfg.Reserve > MaxReserve {
		return nil, fmt.Errorf("kube: reserve %d: want 0 to %d", cfg.Reserve, MaxReserve)
	}
	if cfg.ReserveLease <= 0 {
		cfg.ReserveLease = 2 * time.Minute
	}
	if len(cfg.PoolProfiles) == 0 {
		cfg.PoolProfiles = []string{""}
	}
	if cfg.Pool > 0 || cfg.Reserve > 0 {
		for _, pr := range cfg.PoolProfiles {
			if _, err := poolPolicy(pr); err != nil {
				return nil, err
			}
		}
	}
	return &Backend{cfg: cfg, c: cfg.Client, port: AgentPort, conns: map[string]*conn{}, stop: make(chan struct{}),
		sweepGrace: sweepGrace, reserve: map[string][]*reserved{}, rkick: map[string]chan struct{}{}, token: newSandboxID()[3:]}, nil
}

// Name implements manager.Backend.
func (b *Backend) Name() string { return "kubernetes" }

// Runtimes implements manager.Backend: native and the tiers that have a
// RuntimeClass name.
func (b *Backend) Runtimes() []string {
	out := []string{RuntimeNative}
	for tier := range b.cfg.RuntimeClasses {
		if tier != RuntimeNative {
			out = append(out, tier)
		}
	}
	sort.Strings(out[1:])
	return out
}

// PauseRestart is how a pod pauses (tier.Caps.Pause): agent-sandbox's
// operatingMode Suspended deletes the pod and Running starts a new one, so
// its processes, memory and files outside volumes are lost.
const PauseRestart tier.PauseKind = "restart"

var _ manager.BackendCaps = (*Backend)(nil)

// Caps implements manager.BackendCaps: what a pod of any tier can do. Its
// root is any image of the cluster's registries; it pauses by restarting
// (PauseRestart); it has network only through the cluster's egress proxy,
// fixed at create (the pod's NetworkPolicy and proxy variables); volumes,
// memory snapshots and forks are refused (no runsc checkpoint/restore
// through the CRI, and airlock's volumes are this host's directories, not
// PersistentVolumeClaims yet), as is taking over a sandbox's processes
// (every replica dials the agent: AdoptRunning is the cluster's, not a
// restart's). The native tier is pooled when the server keeps warm pools
// (pool.go).
func (b *Backend) Caps(runtime string) tier.Caps {
	return tier.Caps{ImageRoots: true, Pause: PauseRestart, Network: b.cfg.EgressProxy != "",
		Pooled: b.pooling() && runtime == RuntimeNative}
}

// Close implements manager.Backend: it closes this process's agent
// connections; the sandboxes keep running.
func (b *Backend) Close() error {
	b.stopLoops()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	b.releaseReserve(ctx)
	cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, c := range b.conns {
		c.client.Close()
		delete(b.conns, id)
	}
	return nil
}

// stopLoops stops the sweeper and the reserve's loops and waits for the
// latter.
func (b *Backend) stopLoops() {
	b.stopOnce.Do(func() { close(b.stop) })
	b.rwg.Wait()
}

// caSecret returns the cluster CA, creating the Secret agenttls.CASecretName
// on first use. Servers starting together race to create it: the loser
// reads the winner's.
func (b *Backend) caSecret(ctx context.Context) (*agenttls.CA, error) {
	b.caMu.Lock()
	defer b.caMu.Unlock()
	if b.ca != nil {
		return b.ca, nil
	}
	key := client.ObjectKey{Namespace: b.cfg.Namespace, Name: agenttls.CASecretName}
	for range 3 {
		var s corev1.Secret
		err := b.c.Get(ctx, key, &s)
		if err == nil {
			ca, err := agenttls.ParseCA(s.Data)
			if err != nil {
				return nil, fmt.Errorf("kube: secret %s/%s: %w", key.Namespace, key.Name, err)
			}
			b.ca = ca
			return ca, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kube: read the CA secret %s/%s: %w", key.Namespace, key.Name, err)
		}
		ca, err := agenttls.NewCA(0)
		if err != nil {
			return nil, err
		}
		data, err := ca.SecretData()
		if err != nil {
			return nil, err
		}
		s = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace,
			Labels: map[string]string{LabelManagedBy: ManagedBy}}, Type: corev1.SecretTypeOpaque, Data: data}
		err = b.c.Create(ctx, &s)
		if err == nil {
			b.ca = ca
			return ca, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("kube: create the CA secret %s/%s: %w", key.Namespace, key.Name, err)
		}
	}
	return nil, fmt.Errorf("kube: the CA secret %s/%s keeps changing", key.Namespace, key.Name)
}

// runtimeClass returns the RuntimeClass of tier ("" for the default) and
// checks that the cluster has it.
func (b *Backend) runtimeClass(ctx context.Context, tier string) (string, error) {
	name, ok := b.cfg.RuntimeClasses[tier]
	if !ok {
		if tier == RuntimeNative {
			return "", nil
		}
		return "", fmt.Errorf("%w: runtime %q has no RuntimeClass on this server (--runtime-class)", manager.ErrPolicy, tier)
	}
	var rc nodev1.RuntimeClass
	if err := b.c.Get(ctx, client.ObjectKey{Name: name}, &rc); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("%w: runtime %q needs the RuntimeClass %q, which this cluster does not have", manager.ErrPolicy, tier, name)
		}
		return "", fmt.Errorf("kube: read RuntimeClass %q: %w", name, err)
	}
	return name, nil
}

// env is the sandbox's environment: the policy's, with the egress proxy
// variables pointing at the cluster's proxy by IP address (the
// NetworkPolicy of deploy/airlock/egress-proxy.yaml leaves sandbox pods no
// DNS, so the server resolves the proxy's Service name).
func (b *Backend) env(ctx context.Context, p *policy.Policy) ([]string, error) {
	mode := p.Network.Mode
	if mode == "" || mode == policy.NetNone {
		return p.Env, nil
	}
	if b.cfg.EgressProxy == "" {
		return nil, fmt.Errorf("%w: network mode %q needs the cluster's egress proxy, and this server has none (--kube-egress-proxy)", manager.ErrPolicy, mode)
	}
	host, httpPort := b.cfg.EgressProxy, egressproxy.HTTPPort
	if h, port, err := net.SplitHostPort(b.cfg.EgressProxy); err == nil {
		if httpPort, err = strconv.Atoi(port); err != nil {
			return nil, fmt.Errorf("kube: egress proxy %q: bad port", b.cfg.EgressProxy)
		}
		host = h
	}
	ip, err := resolveOne(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("kube: resolve the egress proxy %q: %w", host, err)
	}
	proxy := map[string]string{}
	for _, kv := range egress.ProxyEnv(httpPort, egressproxy.SOCKSPort) {
		k, v, _ := strings.Cut(kv, "=")
		proxy[k] = strings.ReplaceAll(v, "127.0.0.1:", ip+":")
	}
	var out []string
	for _, kv := range p.Env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := proxy[k]; !ok {
			out = append(out, kv)
		}
	}
	keys := make([]string, 0, len(proxy))
	for k := range proxy {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+proxy[k])
	}
	return out, nil
}

// egressCAPath and egressBundlePath are where a sandbox with injected
// secrets finds its interception CA alone (NODE_EXTRA_CA_CERTS) and with
// the server's CA bundle (SSL_CERT_FILE and the like).
const (
	egressCAPath     = EgressCADir + "/egress-ca.pem"
	egressBundlePath = EgressCADir + "/ca-bundle.crt"
)

// egressSecretData is the data of the egress Secret of a sandbox with
// injected secrets (egressproxy.EgressSecretData) plus EgressBundleKey: the
// server's CA bundle followed by the sandbox's interception CA.
func (b *Backend) egressSecretData(id string, spec manager.RemoteSpec) (map[string][]byte, error) {
	if spec.Policy.Network.Mode == "" || spec.Policy.Network.Mode == policy.NetNone {
		return nil, fmt.Errorf("%w: secrets need network mode allowlist or open (they are injected by the egress proxy)", manager.ErrPolicy)
	}
	bundle := b.cfg.CABundle
	if bundle == "" {
		bundle = manager.CABundlePath
	}
	roots, err := os.ReadFile(bundle)
	if err != nil {
		return nil, fmt.Errorf("kube: secrets need the server's CA bundle for the sandbox's trust store: %w", err)
	}
	data, err := egressproxy.EgressSecretData(id, spec.Secrets)
	if err != nil {
		return nil, fmt.Errorf("kube: egress secret of %s: %w", id, err)
	}
	data[EgressBundleKey] = append(append(append([]byte(nil), roots...), '\n'), data[egressproxy.CACertKey]...)
	return data, nil
}

// trustEnv points the trust-store variables of env at the pod's egress CA
// files (the manager set them to the single-node server's paths).
func trustEnv(env []string) []string {
	set := map[string]string{"SSL_CERT_FILE": egressBundlePath, "REQUESTS_CA_BUNDLE": egressBundlePath,
		"CURL_CA_BUNDLE": egressBundlePath, "NODE_EXTRA_CA_CERTS": egressCAPath}
	out := make([]string, 0, len(env)+len(set))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			out = append(out, kv)
		}
	}
	for _, k := range []string{"CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"} {
		out = append(out, k+"="+set[k])
	}
	return out
}

// resolveOne returns host's first address, IPv4 preferred, bracketed if
// IPv6 (as it goes before ":port").
func resolveOne(ctx context.Context, host string) (string, error) {
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return "", err
	}
	if len(addrs) == 0 {
		return "", errors.New("no address")
	}
	best := addrs[0]
	for _, a := range addrs {
		if a.Unmap().Is4() {
			best = a.Unmap()
			break
		}
	}
	if best.Is6() {
		return "[" + best.String() + "]", nil
	}
	return best.String(), nil
}

// Create implements manager.Backend: the Sandbox, then its Secret (owned by
// the Sandbox, so that the cluster's garbage collector removes it with the
// Sandbox when agent-sandbox deletes it at its shutdownTime).
func (b *Backend) Create(ctx context.Context, spec manager.RemoteSpec) (manager.Info, error) {
	sp := spans.Start()
	class, err := b.runtimeClass(ctx, spec.Runtime)
	if err != nil {
		return manager.Info{}, err
	}
	env, err := b.env(ctx, &spec.Policy)
	if err != nil {
		return manager.Info{}, err
	}
	var egressData map[string][]byte
	if len(spec.Secrets) > 0 {
		if egressData, err = b.egressSecretData(spec.ID, spec); err != nil {
			return manager.Info{}, err
		}
		env = trustEnv(env)
	}
	image := spec.Image
	if image == "" {
		image = b.cfg.DefaultImage
	}
	ps, err := podSpec(podParams{id: spec.ID, policy: spec.Policy, image: image, agentImage: b.cfg.AgentImage,
		runtimeClass: class, env: env, egressCA: egressData != nil})
	if err != nil {
		return manager.Info{}, err
	}
	ca, err := b.caSecret(ctx)
	if err != nil {
		return manager.Info{}, err
	}
	bundle, err := ca.Issue(spec.ID, 0)
	if err != nil {
		return manager.Info{}, err
	}
	pol, err := json.Marshal(spec.Policy)
	if err != nil {
		return manager.Info{}, fmt.Errorf("kube: policy: %w", err)
	}
	network, err := json.Marshal(spec.Policy.Network)
	if err != nil {
		return manager.Info{}, fmt.Errorf("kube: network: %w", err)
	}
	md, err := json.Marshal(spec.Metadata)
	if err != nil {
		return manager.Info{}, fmt.Errorf("kube: metadata: %w", err)
	}
	labels := map[string]string{LabelSandbox: spec.ID, LabelOwner: OwnerLabel(spec.Owner), LabelManagedBy: ManagedBy}
	ann := map[string]string{AnnotationOwner: spec.Owner, AnnotationNetwork: string(network),
		AnnotationPolicy: string(pol), AnnotationMetadata: string(md), AnnotationRuntime: spec.Runtime}
	if pool := b.poolFor(spec, env); pool != "" && egressData == nil {
		sp.Mark("prepare")
		sb, ready, err := b.createPooled(ctx, spec, pool, labels, ann, sp)
		if err != nil {
			return manager.Info{}, err
		}
		in := info(sb)
		if !ready {
			in, err = b.waitReady(ctx, sb, spec)
			sp.Mark("ready")
		}
		sp.Add("id", spec.ID)
		sp.Log("kubernetes: pooled create")
		return in, err
	}
	sb := &sandboxv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: spec.ID, Namespace: b.cfg.Namespace, Labels: labels, Annotations: ann},
		Spec: sandboxv1.SandboxSpec{
			SandboxBlueprint: sandboxv1.SandboxBlueprint{PodTemplate: sandboxv1.PodTemplate{Spec: ps, ObjectMeta: sandboxv1.PodMetadata{
				Labels: labels, Annotations: map[string]string{AnnotationNetwork: string(network)}}}},
			Lifecycle: sandboxv1.Lifecycle{ShutdownTime: ptr.To(metav1.NewTime(spec.ExpiresAt)),
				ShutdownPolicy: ptr.To(sandboxv1.ShutdownPolicyDelete)},
			OperatingMode: sandboxv1.SandboxOperatingModeRunning,
		},
	}
	if err := b.c.Create(ctx, sb); err != nil {
		return manager.Info{}, fmt.Errorf("kube: create Sandbox %s: %w", spec.ID, err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: agenttls.SecretName(spec.ID), Namespace: b.cfg.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: sandboxv1.GroupVersion.String(), Kind: "Sandbox",
				Name: sb.Name, UID: sb.UID}}},
		Type:      corev1.SecretTypeOpaque,
		Data:      bundle.SecretData(),
		Immutable: ptr.To(true),
	}
	if err := b.c.Create(ctx, secret); err != nil {
		// Fail closed: no sandbox without its credentials.
		b.deleteObjects(context.WithoutCancel(ctx), spec.ID)
		return manager.Info{}, fmt.Errorf("kube: create Secret of %s: %w", spec.ID, err)
	}
	if egressData != nil {
		es := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: egressproxy.EgressSecretName(spec.ID), Namespace: b.cfg.Namespace,
				Labels:          map[string]string{LabelSandbox: spec.ID, egressproxy.LabelPurpose: egressproxy.PurposeEgress, LabelManagedBy: ManagedBy},
				OwnerReferences: secret.OwnerReferences},
			Type: corev1.SecretTypeOpaque, Data: egressData, Immutable: ptr.To(true),
		}
		if err := b.c.Create(ctx, es); err != nil {
			b.deleteObjects(context.WithoutCancel(ctx), spec.ID)
			return manager.Info{}, fmt.Errorf("kube: create the egress Secret of %s: %w", spec.ID, err)
		}
	}
	return b.waitReady(ctx, sb, spec)
}

// waitReady is the end of Create: with WaitReady, until the agent of
// sandbox sb answers (or it is removed).
func (b *Backend) waitReady(ctx context.Context, sb *sandboxv1.Sandbox, spec manager.RemoteSpec) (manager.Info, error) {
	if b.cfg.WaitReady {
		wctx, cancel := context.WithTimeout(ctx, b.cfg.ReadyTimeout)
		_, err := b.Connect(wctx, spec.Owner, spec.ID)
		cancel()
		if err != nil {
			b.remove(context.WithoutCancel(ctx), sb)
			return manager.Info{}, fmt.Errorf("kube: sandbox %s did not become ready: %w", spec.ID, err)
		}
	}
	return info(sb), nil
}

// remove deletes what belongs to sandbox sb, pooled or not.
func (b *Backend) remove(ctx context.Context, sb *sandboxv1.Sandbox) error {
	if pooled(sb) {
		return b.releaseClaim(ctx, sb.Name)
	}
	return b.deleteObjects(ctx, sb.Name)
}

// sandbox reads the Sandbox id and checks that it is airlock's and owner's.
func (b *Backend) sandbox(ctx context.Context, owner, id string) (*sandboxv1.Sandbox, error) {
	if !validID(id) {
		return nil, manager.ErrNotFound
	}
	check := func(sb *sandboxv1.Sandbox) (*sandboxv1.Sandbox, error) {
		// A pooled sandbox still being enrolled serves nothing to anyone.
		if !ours(sb) || !enrolled(sb) || sb.Annotations[AnnotationOwner] != owner || !sb.DeletionTimestamp.IsZero() {
			return nil, manager.ErrNotFound
		}
		return sb, nil
	}
	b.mu.Lock()
	c := b.conns[id]
	b.mu.Unlock()
	if c != nil && c.pooled {
		// This process connected to it as a pooled sandbox: its record is
		// a SandboxClaim (one read instead of two).
		sb, err := b.claim(ctx, id)
		if err != nil {
			return nil, err
		}
		if sb != nil {
			return check(sb)
		}
	}
	sb := &sandboxv1.Sandbox{}
	err := b.c.Get(ctx, client.ObjectKey{Namespace: b.cfg.Namespace, Name: id}, sb)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("kube: get Sandbox %s: %w", id, err)
	}
	if err != nil || !ours(sb) {
		// A pooled sandbox's record is its SandboxClaim (pool.go). The
		// claim controller names the Sandbox it makes when the pool is
		// empty after the claim: such a Sandbox is not airlock's record.
		if sb, err = b.claim(ctx, id); err != nil {
			return nil, err
		}
		if sb == nil {
			return nil, manager.ErrNotFound
		}
	}
	return check(sb)
}

// validID accepts the ids airlock gives sandboxes (sb- and hex digits).
func validID(id string) bool {
	hexPart, ok := strings.CutPrefix(id, "sb-")
	if !ok || hexPart == "" || len(hexPart) > 32 {
		return false
	}
	for _, c := range hexPart {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func ours(sb *sandboxv1.Sandbox) bool {
	return sb.Labels[LabelManagedBy] == ManagedBy && sb.Labels[LabelSandbox] == sb.Name
}

// info describes a Sandbox object.
func info(sb *sandboxv1.Sandbox) manager.Info {
	in := manager.Info{ID: sb.Name, State: store.StateRunning, CreatedAt: sb.CreationTimestamp.UTC(),
		Metadata: map[string]string{}, Runtime: sb.Annotations[AnnotationRuntime]}
	if in.CreatedAt.IsZero() {
		in.CreatedAt = time.Now().UTC()
	}
	_ = json.Unmarshal([]byte(sb.Annotations[AnnotationMetadata]), &in.Metadata)
	if in.Metadata == nil {
		in.Metadata = map[string]string{}
	}
	var p policy.Policy
	if json.Unmarshal([]byte(sb.Annotations[AnnotationPolicy]), &p) == nil {
		in.Profile = string(p.Profile)
	}
	if t := sb.Spec.ShutdownTime; t != nil {
		at := t.UTC()
		in.ExpiresAt = &at
		if !at.After(time.Now()) {
			// agent-sandbox's controller deletes it at shutdownTime.
			in.State = store.StateExpired
			in.EndedAt = &at
			in.EndReason = "timeout expired"
		}
	}
	in.Paused = sb.Spec.OperatingMode == sandboxv1.SandboxOperatingModeSuspended
	in.Enforced = enforced(&sb.Spec.PodTemplate.Spec)
	return in
}

// enforced reports what the pod spec asks the node to enforce (the
// kubelet and the container runtime do; this server cannot see the node).
// A pids limit is reported missing: a pod spec has no field for one.
func enforced(ps *corev1.PodSpec) rt.Enforced {
	var out rt.Enforced
	add := func(name, state, detail string) {
		out = append(out, rt.Layer{Name: name, State: state, Detail: detail})
	}
	class := "the cluster's default runtime"
	if ps.RuntimeClassName != nil {
		class = "RuntimeClass " + *ps.RuntimeClassName
	}
	add("runtime", rt.StateOK, "pod, "+class)
	for _, c := range ps.Containers {
		if c.Name != SandboxContainer {
			continue
		}
		sc := c.SecurityContext
		if sc != nil && sc.SeccompProfile != nil {
			add("seccomp", rt.StateOK, string(sc.SeccompProfile.Type)+" (pod spec)")
		} else {
			add("seccomp", rt.StateMissing, "no seccomp profile in the pod spec")
		}
		if sc != nil && sc.Capabilities != nil && slices.Contains(sc.Capabilities.Drop, "ALL") && len(sc.Capabilities.Add) == 0 {
			add("capabilities", rt.StateOK, "all dropped (pod spec)")
		} else {
			add("capabilities", rt.StateMissing, "not all dropped")
		}
		if sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
			add("no_new_privs", rt.StateOK, "allowPrivilegeEscalation: false (pod spec)")
		}
		lim := c.Resources.Limits
		add("cgroup", rt.StateOK, fmt.Sprintf("pod limits: memory %s, cpu %s", lim.Memory(), lim.Cpu()))
	}
	add("pids", rt.StateMissing, "a pod spec has no pids limit: the nodes' kubelet podPidsLimit applies, if set")
	return out
}

// Get implements manager.Backend.
func (b *Backend) Get(ctx context.Context, owner, id string) (manager.Info, error) {
	sb, err := b.sandbox(ctx, owner, id)
	if err != nil {
		return manager.Info{}, err
	}
	return info(sb), nil
}

// Policy implements manager.Backend: the policy annotation of the Sandbox.
func (b *Backend) Policy(ctx context.Context, owner, id string) (policy.Policy, error) {
	var p policy.Policy
	sb, err := b.sandbox(ctx, owner, id)
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal([]byte(sb.Annotations[AnnotationPolicy]), &p); err != nil {
		return p, fmt.Errorf("kube: sandbox %s: policy annotation: %w", id, err)
	}
	return p, nil
}

// list returns the Sandboxes of airlock in the namespace, of owner when
// byOwner.
func (b *Backend) list(ctx context.Context, owner string, byOwner bool) ([]sandboxv1.Sandbox, error) {
	sel := client.MatchingLabels{LabelManagedBy: ManagedBy}
	if byOwner {
		sel[LabelOwner] = OwnerLabel(owner)
	}
	var l sandboxv1.SandboxList
	if err := b.c.List(ctx, &l, client.InNamespace(b.cfg.Namespace), sel); err != nil {
		return nil, fmt.Errorf("kube: list Sandboxes: %w", err)
	}
	claimed, err := b.claims(ctx, sel)
	if err != nil {
		return nil, err
	}
	l.Items = append(l.Items, claimed...)
	out := l.Items[:0]
	for _, sb := range l.Items {
		if ours(&sb) && sb.DeletionTimestamp.IsZero() && (!byOwner || sb.Annotations[AnnotationOwner] == owner) {
			out = append(out, sb)
		}
	}
	return out, nil
}

// List implements manager.Backend.
func (b *Backend) List(ctx context.Context, owner string, opts manager.ListOptions) ([]manager.Info, error) {
	states, limit := opts.Defaults()
	items, err := b.list(ctx, owner, true)
	if err != nil {
		return nil, err
	}
	out := []manager.Info{}
	for i := range items {
		if !enrolled(&items[i]) {
			continue
		}
		in := info(&items[i])
		if in.ID <= opts.After || !slices.Contains(states, in.State) {
			continue
		}
		match := true
		for k, v := range opts.Metadata {
			if in.Metadata[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, in)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Count implements manager.Backend.
func (b *Backend) Count(ctx context.Context, owner string) (all, owned int, err error) {
	items, err := b.list(ctx, owner, false)
	if err != nil {
		return 0, 0, err
	}
	for i := range items {
		if items[i].Annotations[AnnotationOwner] == owner {
			owned++
		}
	}
	return len(items), owned, nil
}

// Kill implements manager.Backend: the Sandbox (and with it its pod) and
// its Secret are deleted.
func (b *Backend) Kill(ctx context.Context, owner, id string) error {
	sb, err := b.sandbox(ctx, owner, id)
	if err != nil {
		return err
	}
	return b.remove(ctx, sb)
}

// deleteObjects deletes sandbox id's Sandbox and Secret and drops this
// process's connection to it.
func (b *Backend) deleteObjects(ctx context.Context, id string) error {
	b.drop(id)
	var errs []error
	fg := client.PropagationPolicy(metav1.DeletePropagationBackground)
	sb := &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: b.cfg.Namespace}}
	if err := b.c.Delete(ctx, sb, fg); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("kube: delete Sandbox %s: %w", id, err))
	}
	for _, name := range []string{agenttls.SecretName(id), egressproxy.EgressSecretName(id)} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.cfg.Namespace}}
		if err := b.c.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("kube: delete Secret %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// drop closes this process's connection to sandbox id, if any.
func (b *Backend) drop(id string) {
	b.mu.Lock()
	c := b.conns[id]
	delete(b.conns, id)
	b.mu.Unlock()
	if c != nil {
		c.client.Close()
	}
}

// patch applies a JSON merge patch to sandbox id's spec.
func (b *Backend) patch(ctx context.Context, sb *sandboxv1.Sandbox, spec map[string]any) error {
	data, err := json.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return err
	}
	if err := b.c.Patch(ctx, sb, client.RawPatch(types.MergePatchType, data)); err != nil {
		if apierrors.IsNotFound(err) {
			return manager.ErrNotFound
		}
		return fmt.Errorf("kube: patch Sandbox %s: %w", sb.Name, err)
	}
	return nil
}

// SetExpiry implements manager.Backend: it moves the Sandbox's shutdownTime.
func (b *Backend) SetExpiry(ctx context.Context, owner, id string, at time.Time) (manager.Info, error) {
	sb, err := b.sandbox(ctx, owner, id)
	if err != nil {
		return manager.Info{}, err
	}
	if in := info(sb); in.State != store.StateRunning {
		return manager.Info{}, fmt.Errorf("%w: %s", manager.ErrNotRunning, in.State)
	}
	at = at.UTC().Truncate(time.Second)
	if pooled(sb) {
		// The claim's lifecycle: agent-sandbox deletes the claim, and with
		// it its Sandbox, then.
		if err := b.patchClaim(ctx, sb.Name, map[string]any{"spec": map[string]any{"lifecycle": map[string]any{"shutdownTime": metav1.NewTime(at)}}}); err != nil {
			return manager.Info{}, err
		}
		sb.Spec.ShutdownTime = ptr.To(metav1.NewTime(at))
		return info(sb), nil
	}
	if err := b.patch(ctx, sb, map[string]any{"shutdownTime": metav1.NewTime(at)}); err != nil {
		return manager.Info{}, err
	}
	return info(sb), nil
}

// SetPaused implements manager.Backend: operatingMode Suspended deletes the
// pod (its processes and the files outside volumes are lost), Running
// starts a new one.
func (b *Backend) SetPaused(ctx context.Context, owner, id string, paused bool) (manager.Info, error) {
	sb, err := b.sandbox(ctx, owner, id)
	if err != nil {
		return manager.Info{}, err
	}
	if in := info(sb); in.State != store.StateRunning {
		return manager.Info{}, fmt.Errorf("%w: %s", manager.ErrNotRunning, in.State)
	}
	if pooled(sb) {
		// Suspended deletes the pod and Running makes a new one from the
		// pool's template: an agent nobody would enroll.
		return manager.Info{}, fmt.Errorf("%w: %w: a sandbox from the warm pool cannot pause on kubernetes (its new pod would not be enrolled); create it with custom limits to get an unpooled one", manager.ErrPolicy, manager.ErrBackend)
	}
	mode := sandboxv1.SandboxOperatingModeRunning
	if paused {
		mode = sandboxv1.SandboxOperatingModeSuspended
	}
	if err := b.patch(ctx, sb, map[string]any{"operatingMode": mode}); err != nil {
		return manager.Info{}, err
	}
	if paused {
		b.drop(id)
	}
	return info(sb), nil
}

// Connect implements manager.Backend: it finds the sandbox's pod (the
// Sandbox's name, or agent-sandbox's pod-name annotation), waits for it to
// run, and dials its agent with the sandbox's credentials. A connection
// this process already has to the same pod is reused.
func (b *Backend) Connect(ctx context.Context, owner, id string) (rs manager.RemoteSandbox, err error) {
	sp := spans.Start()
	sp.Add("id", id)
	reused := false
	defer func() {
		sp.Add("reused", reused)
		sp.Add("ok", err == nil)
		sp.Log("kubernetes: connect")
	}()
	sb, err := b.sandbox(ctx, owner, id)
	if err != nil {
		return manager.RemoteSandbox{}, err
	}
	sp.Mark("record")
	rs = manager.RemoteSandbox{Info: info(sb)}
	if err := json.Unmarshal([]byte(sb.Annotations[AnnotationPolicy]), &rs.Policy); err != nil {
		return rs, fmt.Errorf("kube: sandbox %s: policy annotation: %w", id, err)
	}
	if rs.Info.State != store.StateRunning {
		return rs, fmt.Errorf("%w: %s", manager.ErrNotRunning, rs.Info.State)
	}
	if rs.Info.Paused {
		return rs, nil
	}
	pod, err := b.runningPod(ctx, sb)
	if err != nil {
		return rs, err
	}
	sp.Mark("pod")
	b.mu.Lock()
	c := b.conns[id]
	b.mu.Unlock()
	if c != nil && c.pod == pod.UID {
		select {
		case <-c.client.Done():
		default:
			rs.Client, reused = c.client, true
			return rs, nil
		}
	}
	var secret corev1.Secret
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: b.cfg.Namespace, Name: agenttls.SecretName(id)}, &secret); err != nil {
		return rs, fmt.Errorf("kube: the Secret of sandbox %s: %w", id, err)
	}
	sp.Mark("secret")
	creds, err := agenttls.NewClientCreds(id, secret.Data)
	if err != nil {
		return rs, err
	}
	nc, err := agenttls.Dial(ctx, net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(b.port)), creds)
	if err != nil {
		return rs, err
	}
	sp.Mark("dial")
	ac, err := agent.NewClient(nc)
	if err != nil {
		nc.Close()
		return rs, fmt.Errorf("kube: agent of sandbox %s: %w", id, err)
	}
	b.mu.Lock()
	if old := b.conns[id]; old != nil {
		old.client.Close()
	}
	b.conns[id] = &conn{pod: pod.UID, client: ac, pooled: pooled(sb)}
	b.mu.Unlock()
	rs.Client = ac
	return rs, nil
}

// runningPod waits (within ctx and ReadyTimeout) for the pod of sb to run
// with an IP, and checks that it is sb's.
func (b *Backend) runningPod(ctx context.Context, sb *sandboxv1.Sandbox) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ReadyTimeout)
	defer cancel()
	name := sb.Name
	if n := sb.Annotations[sandboxv1.SandboxPodNameAnnotation]; n != "" {
		name = n
	}
	var last string
	for {
		var pod corev1.Pod
		err := b.c.Get(ctx, client.ObjectKey{Namespace: b.cfg.Namespace, Name: name}, &pod)
		switch {
		case err == nil && pooled(sb) && string(pod.UID) != sb.Annotations[AnnotationEnrolledPod]:
			// Only the pod enrolled for the claim is the sandbox's; a pod
			// made since (the first one died) is an unenrolled pooled agent.
			return nil, fmt.Errorf("%w: pod %s of pooled sandbox %s was replaced since its enrollment (its processes and files are lost)", manager.ErrNotRunning, name, sb.Name)
		case err == nil && !pooled(sb) && pod.Labels[LabelSandbox] != sb.Name:
			return nil, fmt.Errorf("kube: pod %s is not sandbox %s's", name, sb.Name)
		case err == nil && pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "" && pod.DeletionTimestamp.IsZero():
			return &pod, nil
		case err == nil:
			last = fmt.Sprintf("pod %s is %s", name, pod.Status.Phase)
			if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
				return nil, fmt.Errorf("%w: %s", manager.ErrNotRunning, last)
			}
		case apierrors.IsNotFound(err):
			last = fmt.Sprintf("pod %s does not exist yet", name)
		default:
			return nil, fmt.Errorf("kube: get pod %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			// 409: the sandbox exists but cannot serve yet (a pod starting,
			// pending or being replaced).
			return nil, fmt.Errorf("%w: sandbox %s has no running pod: %s (%v)", manager.ErrNotRunning, sb.Name, last, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// v1alpha1StateAnnotation is the annotation agent-sandbox's conversion
// webhook (v0.5) adds to a Sandbox converted from v1alpha1 to v1beta1: the
// whole old object, kept for a lossless way back. A Sandbox read with it
// was written by a server of agent-sandbox v0.2's API and is still stored
// as v1alpha1.
const v1alpha1StateAnnotation = "api.agents.x-k8s.io/v1alpha1-sandbox-state"

// MigrateStorage rewrites airlock's Sandboxes that are still stored as
// v1alpha1 (made by servers built with agent-sandbox v0.2.1) so that the
// API server stores them as v1beta1: a merge patch that drops the
// conversion webhook's v1alpha1-state annotation, guarded by the
// resourceVersion read (a Sandbox changed meanwhile was rewritten by that
// change). Until then every read of such a Sandbox goes through
// agent-sandbox's conversion webhook; after it, none does. It returns how
// many it rewrote. Safe to run from every replica at once.
func (b *Backend) MigrateStorage(ctx context.Context) (int, error) {
	items, err := b.list(ctx, "", false)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for i := range items {
		sb := &items[i]
		if _, old := sb.Annotations[v1alpha1StateAnnotation]; !old {
			continue
		}
		data, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": sb.ResourceVersion,
			"annotations":     map[string]any{v1alpha1StateAnnotation: nil}}})
		if err != nil {
			return n, err
		}
		err = b.c.Patch(ctx, sb, client.RawPatch(types.MergePatchType, data))
		switch {
		case err == nil:
			n++
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone, or rewritten by a change since the list.
		default:
			errs = append(errs, fmt.Errorf("kube: migrate Sandbox %s to v1beta1: %w", sb.Name, err))
		}
	}
	return n, errors.Join(errs...)
}
