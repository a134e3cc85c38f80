package kube

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/kube/agenttls"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/tier"
)

func getSandbox(t *testing.T, id string) *sandboxv1.Sandbox {
	t.Helper()
	var sb sandboxv1.Sandbox
	if err := admin.Get(context.Background(), client.ObjectKey{Namespace: sandboxNS, Name: id}, &sb); err != nil {
		t.Fatalf("Sandbox %s: %v", id, err)
	}
	return &sb
}

// TestCreateSandboxObject: a create through the Manager makes a Sandbox
// whose pod template is the policy (resources, locked-down securityContext,
// init container delivering the agent, the agent listening with the
// sandbox's Secret), labelled and annotated per the contract, and a Secret
// owned by it holding a certificate of the cluster CA for the sandbox's id
// and a token. The pod the controller would make from the template is
// admitted by the namespace's restricted Pod Security level.
func TestCreateSandboxObject(t *testing.T) {
	needEnv(t)
	r := newReplica(t, nil)
	ctx := context.Background()
	in, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-a", Profile: "standard",
		Limits: manager.Limits{MemoryBytes: 384 << 20, CPUs: 1.5, DiskBytes: 200 << 20},
		Env:    map[string]string{"GREETING": "hi"}, Metadata: map[string]string{"team": "red"}, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(in.ID, "sb-") || in.State != "running" || in.Runtime != RuntimeNative || in.Metadata["team"] != "red" {
		t.Fatalf("info %+v", in)
	}
	if l, ok := in.Enforced.Get("pids"); !ok || l.State != "missing" {
		t.Errorf("pids layer %+v: a pod has no pids limit, and the info must say so", l)
	}
	if l, ok := in.Enforced.Get("seccomp"); !ok || l.State != "ok" {
		t.Errorf("seccomp layer %+v", l)
	}
	sb := getSandbox(t, in.ID)
	for k, v := range map[string]string{LabelSandbox: in.ID, LabelOwner: OwnerLabel("key-a"), LabelManagedBy: "airlock"} {
		if sb.Labels[k] != v || sb.Spec.PodTemplate.ObjectMeta.Labels[k] != v {
			t.Errorf("label %s = %q (pod template %q), want %q", k, sb.Labels[k], sb.Spec.PodTemplate.ObjectMeta.Labels[k], v)
		}
	}
	if sb.Annotations[AnnotationOwner] != "key-a" {
		t.Errorf("owner annotation %q", sb.Annotations[AnnotationOwner])
	}
	var n policy.Network
	if err := json.Unmarshal([]byte(sb.Spec.PodTemplate.ObjectMeta.Annotations[AnnotationNetwork]), &n); err != nil || n.Mode != policy.NetNone {
		t.Errorf("pod network annotation %q: %v", sb.Spec.PodTemplate.ObjectMeta.Annotations[AnnotationNetwork], err)
	}
	if sb.Spec.OperatingMode != sandboxv1.SandboxOperatingModeRunning {
		t.Errorf("operatingMode %q", sb.Spec.OperatingMode)
	}
	if st := sb.Spec.ShutdownTime; st == nil || st.Time.Sub(*in.ExpiresAt).Abs() > time.Second ||
		time.Until(st.Time) < 9*time.Minute || time.Until(st.Time) > 10*time.Minute {
		t.Errorf("shutdownTime %v, expires_at %v", st, in.ExpiresAt)
	}
	if sb.Spec.ShutdownPolicy == nil || *sb.Spec.ShutdownPolicy != sandboxv1.ShutdownPolicyDelete {
		t.Errorf("shutdownPolicy %v", sb.Spec.ShutdownPolicy)
	}
	ps := sb.Spec.PodTemplate.Spec
	if ps.RuntimeClassName != nil {
		t.Errorf("native tier has runtimeClassName %q", *ps.RuntimeClassName)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken || ps.HostNetwork || ps.HostPID || ps.HostIPC {
		t.Errorf("pod spec shares host namespaces or mounts a token: %+v", ps)
	}
	if len(ps.InitContainers) != 1 || len(ps.Containers) != 1 {
		t.Fatalf("containers %d init, %d main", len(ps.InitContainers), len(ps.Containers))
	}
	ic, c := ps.InitContainers[0], ps.Containers[0]
	if ic.Name != InitContainer || ic.Image != "registry.test/airlock:1" ||
		!slices.Equal(ic.Command, []string{"/airlock", "install-agent", "/airlock-bin/airlock"}) {
		t.Errorf("init container %s %s %v", ic.Name, ic.Image, ic.Command)
	}
	if c.Name != SandboxContainer || c.Image != "registry.test/python:3" ||
		!slices.Equal(c.Command, []string{"/airlock-bin/airlock", "agent", "--listen", ":7070", "--tls-dir", "/airlock-tls"}) {
		t.Errorf("main container %s %s %v", c.Name, c.Image, c.Command)
	}
	for _, ctr := range []corev1.Container{ic, c} {
		sc := ctr.SecurityContext
		if sc == nil || !*sc.RunAsNonRoot || *sc.RunAsUser == 0 || *sc.AllowPrivilegeEscalation || *sc.Privileged ||
			!*sc.ReadOnlyRootFilesystem || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
			len(sc.Capabilities.Add) != 0 || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("container %s securityContext %+v", ctr.Name, sc)
		}
	}
	if got := c.Resources.Limits.Memory().Value(); got != 384<<20 {
		t.Errorf("memory limit %d, want %d", got, 384<<20)
	}
	if got := c.Resources.Limits.Cpu().MilliValue(); got != 1500 {
		t.Errorf("cpu limit %dm, want 1500m", got)
	}
	if got := c.Resources.Limits.StorageEphemeral().Value(); got != 2*200<<20 {
		t.Errorf("ephemeral-storage limit %d", got)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["GREETING"] != "hi" {
		t.Errorf("env %v", env)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.MountPath] = vm
	}
	if m := mounts["/airlock-tls"]; m.Name != TLSVolume || !m.ReadOnly {
		t.Errorf("tls mount %+v", m)
	}
	if m := mounts["/airlock-bin"]; m.Name != BinVolume || !m.ReadOnly {
		t.Errorf("bin mount %+v", m)
	}
	var secretVol string
	for _, v := range ps.Volumes {
		if v.Name == TLSVolume && v.Secret != nil {
			secretVol = v.Secret.SecretName
		}
	}
	if secretVol != "airlock-"+in.ID+"-tls" {
		t.Errorf("tls volume's secret %q", secretVol)
	}

	// The Secret: owned by the Sandbox, the CA's certificate for the id.
	var sec corev1.Secret
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: secretVol}, &sec); err != nil {
		t.Fatal(err)
	}
	if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != sb.UID || sec.OwnerReferences[0].Kind != "Sandbox" {
		t.Errorf("secret owners %+v", sec.OwnerReferences)
	}
	var ca corev1.Secret
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: agenttls.CASecretName}, &ca); err != nil {
		t.Fatal(err)
	}
	if len(sec.Data[agenttls.TokenKey]) < 32 {
		t.Errorf("token %d bytes", len(sec.Data[agenttls.TokenKey]))
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca.Data[agenttls.CACertKey]) {
		t.Fatal("CA secret holds no certificate")
	}
	blk, _ := pem.Decode(sec.Data[agenttls.CertKey])
	if blk == nil {
		t.Fatal("no certificate in the sandbox's secret")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: in.ID}); err != nil {
		t.Errorf("sandbox certificate does not verify for %s against the cluster CA: %v", in.ID, err)
	}

	// What agent-sandbox's controller would create from the template is
	// admitted under Pod Security "restricted"; the same pod allowed to
	// escalate privileges is refused (the check is live).
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: in.ID, Namespace: sandboxNS, Labels: sb.Spec.PodTemplate.ObjectMeta.Labels},
		Spec: *ps.DeepCopy()}
	if err := admin.Create(ctx, pod, client.DryRunAll); err != nil {
		t.Errorf("the sandbox's pod is not admitted in %s (restricted): %v", sandboxNS, err)
	}
	bad := pod.DeepCopy()
	bad.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
	if err := admin.Create(ctx, bad, client.DryRunAll); !apierrors.IsForbidden(err) {
		t.Errorf("a privilege-escalating pod in %s: %v, want forbidden by Pod Security", sandboxNS, err)
	}
}

// TestRuntimeClasses: a tier maps to its configured RuntimeClass, and a
// tier whose RuntimeClass the cluster lacks is refused with ErrPolicy
// before anything is created.
func TestRuntimeClasses(t *testing.T) {
	needEnv(t)
	r := newReplica(t, func(c *Config) {
		c.RuntimeClasses = map[string]string{RuntimeGVisor: "gvisor-t", RuntimeMicroVM: "kata-t"}
	})
	ctx := context.Background()
	if got := r.m.Runtimes(); !slices.Equal(got, []string{"native", "gvisor", "microvm"}) {
		t.Errorf("runtimes %v", got)
	}
	before := countSandboxes(t)
	_, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-rc", Runtime: "gvisor"})
	if !errors.Is(err, manager.ErrPolicy) || !strings.Contains(err.Error(), "gvisor-t") {
		t.Fatalf("gvisor without its RuntimeClass: %v, want ErrPolicy naming gvisor-t", err)
	}
	if n := countSandboxes(t); n != before {
		t.Errorf("a refused create left objects: %d sandboxes, had %d", n, before)
	}
	for _, name := range []string{"gvisor-t", "kata-t"} {
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: strings.TrimSuffix(name, "-t")}
		if err := admin.Create(ctx, rc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Delete(context.Background(), rc) })
	}
	for tier, class := range map[string]string{"gvisor": "gvisor-t", "microvm": "kata-t"} {
		in, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-rc", Runtime: tier})
		if err != nil {
			t.Fatalf("%s: %v", tier, err)
		}
		sb := getSandbox(t, in.ID)
		if rcn := sb.Spec.PodTemplate.Spec.RuntimeClassName; rcn == nil || *rcn != class || in.Runtime != tier {
			t.Errorf("%s: runtimeClassName %v, info runtime %q", tier, rcn, in.Runtime)
		}
	}
	if _, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-rc", Runtime: "wasm"}); !errors.Is(err, manager.ErrPolicy) {
		t.Errorf("wasm: %v, want ErrPolicy", err)
	}
}

func countSandboxes(t *testing.T) int {
	t.Helper()
	var l sandboxv1.SandboxList
	if err := admin.List(context.Background(), &l, client.InNamespace(sandboxNS)); err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

// TestLifecycle: list, TTL (shutdownTime), pause (operatingMode Suspended) and resume,
// kill (the Sandbox and its Secret gone), owners kept apart.
func TestLifecycle(t *testing.T) {
	needEnv(t)
	r := newReplica(t, nil)
	ctx := context.Background()
	var ids []string
	for i := range 3 {
		md := map[string]string{"n": string(rune('a' + i))}
		in, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-life", Metadata: md})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, in.ID)
	}
	other, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-other"})
	if err != nil {
		t.Fatal(err)
	}
	list, err := r.m.List(ctx, "key-life", manager.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, in := range list {
		got = append(got, in.ID)
	}
	slices.Sort(ids)
	if !slices.Equal(got, ids) {
		t.Fatalf("list %v, want %v", got, ids)
	}
	if l, _ := r.m.List(ctx, "key-life", manager.ListOptions{Metadata: map[string]string{"n": "b"}}); len(l) != 1 || l[0].Metadata["n"] != "b" {
		t.Errorf("metadata filter: %+v", l)
	}
	if _, err := r.m.Get(ctx, "key-life", other.ID); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("another owner's sandbox: %v, want ErrNotFound", err)
	}
	if err := r.m.Kill(ctx, "key-life", other.ID); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("kill of another owner's sandbox: %v, want ErrNotFound", err)
	}
	id := ids[0]

	// TTL.
	in, err := r.m.SetTimeout(ctx, "key-life", id, 3*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sb := getSandbox(t, id)
	if st := sb.Spec.ShutdownTime; st == nil || time.Until(st.Time) < 2*time.Hour+50*time.Minute || in.ExpiresAt == nil || !in.ExpiresAt.Equal(st.Time) {
		t.Errorf("after SetTimeout(3h): shutdownTime %v, info %v", st, in.ExpiresAt)
	}

	// Pause and resume.
	if in, err = r.m.Pause(ctx, "key-life", id); err != nil || !in.Paused {
		t.Fatalf("pause: %+v %v", in, err)
	}
	if sb := getSandbox(t, id); sb.Spec.OperatingMode != sandboxv1.SandboxOperatingModeSuspended {
		t.Errorf("paused: operatingMode %q", sb.Spec.OperatingMode)
	}
	if in, _ := r.m.Get(ctx, "key-life", id); !in.Paused {
		t.Errorf("get of a paused sandbox: %+v", in)
	}
	if _, err := r.m.Lookup("key-life", id); !errors.Is(err, manager.ErrPaused) {
		t.Errorf("lookup of a paused sandbox: %v, want ErrPaused", err)
	}
	if in, err = r.m.Resume(ctx, "key-life", id); err != nil || in.Paused {
		t.Fatalf("resume: %+v %v", in, err)
	}
	if sb := getSandbox(t, id); sb.Spec.OperatingMode != sandboxv1.SandboxOperatingModeRunning {
		t.Errorf("resumed: operatingMode %q", sb.Spec.OperatingMode)
	}

	// Kill: the Sandbox and the Secret are gone.
	if err := r.m.Kill(ctx, "key-life", id); err != nil {
		t.Fatal(err)
	}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: id}, &sandboxv1.Sandbox{}); !apierrors.IsNotFound(err) {
		t.Errorf("Sandbox after kill: %v", err)
	}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: agenttls.SecretName(id)}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("Secret after kill: %v", err)
	}
	// The killing server still describes it (its store); another does
	// not know it.
	if in, err := r.m.Get(ctx, "key-life", id); err != nil || in.State != "killed" || in.EndedAt == nil {
		t.Errorf("get after kill: %+v %v", in, err)
	}
	if err := r.m.Kill(ctx, "key-life", id); !errors.Is(err, manager.ErrNotRunning) {
		t.Errorf("second kill: %v, want ErrNotRunning", err)
	}
	if _, err := newReplica(t, nil).m.Get(ctx, "key-life", id); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("get after kill from another replica: %v", err)
	}

	// An expired sandbox (agent-sandbox deletes it; until then) is not
	// running.
	past := metav1.NewTime(time.Now().Add(-time.Minute))
	sb = getSandbox(t, ids[1])
	sb.Spec.ShutdownTime = &past
	if err := admin.Update(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if in, err := r.m.Get(ctx, "key-life", ids[1]); err != nil || in.State != "expired" {
		t.Errorf("past shutdownTime: %+v %v", in, err)
	}
	if _, err := r.m.SetTimeout(ctx, "key-life", ids[1], time.Hour); !errors.Is(err, manager.ErrNotRunning) {
		t.Errorf("SetTimeout of an expired sandbox: %v", err)
	}
	if l, _ := r.m.List(ctx, "key-life", manager.ListOptions{}); len(l) != 1 || l[0].ID != ids[2] {
		t.Errorf("running list after kill and expiry: %+v", l)
	}
}

// TestRefusals: what the kubernetes backend cannot do is refused with
// ErrPolicy (422) and creates nothing.
func TestRefusals(t *testing.T) {
	needEnv(t)
	r := newReplica(t, nil)
	ctx := context.Background()
	before := countSandboxes(t)
	for name, req := range map[string]manager.CreateRequest{
		"fork":               {Snapshot: "snap-0123"},
		"volumes":            {Volumes: []manager.VolumeRef{{Name: "v", Path: "/data"}}},
		"user-root":          {User: "root"},
		"secrets-no-network": {Secrets: []egress.Secret{{Host: "api.example.com", Header: "X-Key", Value: "v"}}},
		"pause-ttl":          {Metadata: map[string]string{manager.OnTimeoutKey: "pause"}},
		"no-egress":          {Network: policy.Network{Mode: policy.NetAllowlist, Allow: []string{"example.com"}}},
		"wasm":               {Runtime: "wasm"},
	} {
		req.Owner = "key-ref"
		if _, err := r.m.Create(ctx, req); !errors.Is(err, manager.ErrPolicy) {
			t.Errorf("%s: %v, want ErrPolicy", name, err)
		}
	}
	if n := countSandboxes(t); n != before {
		t.Errorf("refused creates left %d sandboxes", n-before)
	}
	// Refusals by declared capability name the runtime, the backend and
	// the capability (as a single node's tiers do), for every runtime.
	for _, rtName := range []string{"native", "gvisor"} {
		for capName, req := range map[string]manager.CreateRequest{
			"memory_snapshot": {Snapshot: "snap-0123"},
			"volumes":         {Volumes: []manager.VolumeRef{{Name: "v", Path: "/data"}}},
			"network":         {Network: policy.Network{Mode: policy.NetOpen}},
		} {
			req.Owner, req.Runtime = "key-ref", rtName
			_, err := r.m.Create(ctx, req)
			if !errors.Is(err, manager.ErrPolicy) || !errors.Is(err, tier.ErrNotSupported) ||
				!strings.Contains(err.Error(), "runtime "+rtName+" of backend kubernetes does not support") ||
				!strings.Contains(err.Error(), "(capability "+capName+")") {
				t.Errorf("%s on %s: %v, want a refusal naming the runtime and capability %s", capName, rtName, err, capName)
			}
		}
	}
	caps := r.m.RuntimeCaps()
	if c, ok := caps["native"]; !ok || c.Volumes || c.MemorySnapshot || c.Network || !c.ImageRoots || c.Pause != PauseRestart {
		t.Errorf("declared caps %+v", caps)
	}
	if n := countSandboxes(t); n != before {
		t.Errorf("refused creates left %d sandboxes", n-before)
	}
	in, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-ref"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.m.MemorySnapshot(ctx, "key-ref", in.ID); !errors.Is(err, manager.ErrPolicy) || !errors.Is(err, manager.ErrBackend) {
		t.Errorf("memory snapshot: %v, want ErrPolicy (backend)", err)
	}
	if _, err := r.m.Snapshot(ctx, "key-ref", in.ID, ""); !errors.Is(err, manager.ErrPolicy) || !errors.Is(err, manager.ErrBackend) {
		t.Errorf("image snapshot: %v, want ErrPolicy (backend)", err)
	}
	if _, err := r.m.SetNetwork(ctx, "key-ref", in.ID, policy.Network{Mode: policy.NetNone}); !errors.Is(err, manager.ErrPolicy) {
		t.Errorf("set network: %v, want ErrPolicy", err)
	}
}

// TestEgressProxyEnv: with the cluster's egress proxy configured, a sandbox
// with network gets the proxy variables pointing at its address (resolved
// by the server: sandbox pods have no DNS), HTTP and SOCKS, and the
// network policy annotation on its pod.
func TestEgressProxyEnv(t *testing.T) {
	needEnv(t)
	r := newReplica(t, func(c *Config) { c.EgressProxy = "localhost:3128" })
	in, err := r.m.Create(context.Background(), manager.CreateRequest{Owner: "key-net",
		Network: policy.Network{Mode: policy.NetAllowlist, Allow: []string{"pypi.org"}}})
	if err != nil {
		t.Fatal(err)
	}
	sb := getSandbox(t, in.ID)
	env := map[string]string{}
	for _, e := range sb.Spec.PodTemplate.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	// The proxy's name resolved by the server (sandboxes have no DNS):
	// localhost stands for the Service name here.
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		if env[k] != "http://127.0.0.1:3128" {
			t.Errorf("%s=%q", k, env[k])
		}
	}
	if env["ALL_PROXY"] != "socks5h://127.0.0.1:1080" {
		t.Errorf("ALL_PROXY=%q", env["ALL_PROXY"])
	}
	for k, v := range env {
		if strings.Contains(v, "localhost") && k != "NO_PROXY" && k != "no_proxy" {
			t.Errorf("%s=%q names the proxy instead of its address", k, v)
		}
	}
	if ni, err := r.m.Network(context.Background(), "key-net", in.ID); err != nil || ni.Mode != "allowlist" || !slices.Equal(ni.Allow, []string{"pypi.org"}) {
		t.Errorf("network of the sandbox: %+v %v", ni, err)
	}
	if _, err := r.m.Network(context.Background(), "key-other", in.ID); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("network of another key's sandbox: %v", err)
	}
	var n policy.Network
	if err := json.Unmarshal([]byte(sb.Spec.PodTemplate.ObjectMeta.Annotations[AnnotationNetwork]), &n); err != nil ||
		n.Mode != policy.NetAllowlist || !slices.Contains(n.Allow, "pypi.org") {
		t.Errorf("network annotation %q: %v", sb.Spec.PodTemplate.ObjectMeta.Annotations[AnnotationNetwork], err)
	}
}

// TestCeilings: the server's own size is no ceiling of a cluster's
// sandboxes (a single-node server caps limits at its host's RAM and CPUs);
// configured ceilings still apply.
func TestCeilings(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	host, err := policy.HostCeilings()
	if err != nil {
		t.Fatal(err)
	}
	big := manager.Limits{MemoryBytes: 2 * host.MemoryBytes, CPUs: 2 * host.CPUs}
	in, err := newReplica(t, nil).m.Create(ctx, manager.CreateRequest{Owner: "key-ceil", Limits: big})
	if err != nil {
		t.Fatalf("limits above this host's size on a cluster: %v", err)
	}
	c := getSandbox(t, in.ID).Spec.PodTemplate.Spec.Containers[0]
	if c.Resources.Limits.Memory().Value() != big.MemoryBytes {
		t.Errorf("memory limit %v", c.Resources.Limits.Memory())
	}
	r := newReplicaCeilings(t, nil, policy.Ceilings{MemoryBytes: 1 << 30})
	if _, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-ceil", Limits: manager.Limits{MemoryBytes: 2 << 30}}); !errors.Is(err, manager.ErrInvalid) {
		t.Errorf("above the configured ceiling: %v, want ErrInvalid", err)
	}
}

// TestLookupWithoutPod: a sandbox whose pod does not run (yet) cannot
// serve: a lookup waits for it at most the ready timeout, then says the
// sandbox is not running (409), naming what it saw.
func TestLookupWithoutPod(t *testing.T) {
	needEnv(t)
	r := newReplica(t, func(c *Config) { c.ReadyTimeout = time.Second })
	in, err := r.m.Create(context.Background(), manager.CreateRequest{Owner: "key-nopod"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.m.Lookup("key-nopod", in.ID)
	if !errors.Is(err, manager.ErrNotRunning) || !strings.Contains(err.Error(), "does not exist yet") {
		t.Errorf("lookup without a pod: %v, want ErrNotRunning saying the pod does not exist", err)
	}
}
