package kube

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-dev/airlock/agent"
	alclient "github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/kube/agenttls"
	"github.com/airlock-dev/airlock/manager"
)

// The warm-pool tests play agent-sandbox's controllers and the kubelet, as
// the other tests of this package do (there is neither here): a pool's
// Sandbox is published from the SandboxTemplate the server made, owned by
// its SandboxWarmPool, with a pod Running at a loopback address of its own
// where `airlock agent --pool-ca` (the tagged build, as the pod's uid)
// listens on AgentPort; a claim is bound as the claim controller does it
// (the claim's assigned-sandbox annotation, the Sandbox's controller
// reference moved to the claim). What only the controllers do (refilling
// the pool, deleting a released claim's pod) is for the real-node e2e.

// randomLoopback returns a random 127/8 address for a stand-in pod.
func randomLoopback() string {
	return fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(250), 1+rand.IntN(250), 2+rand.IntN(250))
}

// startPooledAgent runs `airlock agent --listen ip:AgentPort --pool-ca`
// with the pool CA Secret's ca.crt, as a pooled pod would.
func startPooledAgent(t *testing.T, ip string) *podAgent {
	t.Helper()
	var sec corev1.Secret
	if err := admin.Get(context.Background(), client.ObjectKey{Namespace: sandboxNS, Name: PoolCASecret}, &sec); err != nil {
		t.Fatal(err)
	}
	root, err := os.MkdirTemp("", "airlock-pooled-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	os.Chmod(root, 0o755)
	caDir, work := filepath.Join(root, "ca"), filepath.Join(root, "workspace")
	for _, d := range []string{caDir, work} {
		os.Mkdir(d, 0o755)
		os.Chown(d, sandboxUID, sandboxUID)
	}
	if err := os.WriteFile(filepath.Join(caDir, agenttls.CACertKey), sec.Data[agenttls.CACertKey], 0o444); err != nil {
		t.Fatal(err)
	}
	return runPodAgent(t, work, "--listen", net.JoinHostPort(ip, strconv.Itoa(AgentPort)), "--pool-ca", caDir)
}

// publishPoolSandbox makes a Sandbox of pool (from its SandboxTemplate,
// controlled by the SandboxWarmPool) and its pod, Running at ip, as the
// warm-pool controller and the kubelet would.
func publishPoolSandbox(t *testing.T, pool, ip string) *sandboxv1.Sandbox {
	t.Helper()
	var wp extv1.SandboxWarmPool
	if err := admin.Get(context.Background(), client.ObjectKey{Namespace: sandboxNS, Name: pool}, &wp); err != nil {
		t.Fatal(err)
	}
	return publishSandbox(t, pool, ip, metav1.ObjectMeta{GenerateName: pool + "-", Labels: map[string]string{sandboxv1.SandboxWarmPoolLabel: "h"},
		OwnerReferences: controlledBy(extv1.GroupVersion.String(), "SandboxWarmPool", &wp)})
}

// controlledBy is a controller owner reference to obj.
func controlledBy(apiVersion, kind string, obj metav1.Object) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: obj.GetName(), UID: obj.GetUID(), Controller: ptr.To(true)}}
}

// publishSandbox makes a Sandbox of pool's template with meta, and its pod
// Running at ip.
func publishSandbox(t *testing.T, pool, ip string, meta metav1.ObjectMeta) *sandboxv1.Sandbox {
	t.Helper()
	ctx := context.Background()
	var tmpl extv1.SandboxTemplate
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: pool}, &tmpl); err != nil {
		t.Fatal(err)
	}
	meta.Namespace = sandboxNS
	sb := &sandboxv1.Sandbox{ObjectMeta: meta, Spec: sandboxv1.SandboxSpec{SandboxBlueprint: *tmpl.Spec.SandboxBlueprint.DeepCopy()}}
	if err := admin.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Delete(context.Background(), sb) })
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sb.Name, Namespace: sandboxNS, Labels: sb.Spec.PodTemplate.ObjectMeta.Labels,
		Annotations:     sb.Spec.PodTemplate.ObjectMeta.Annotations,
		OwnerReferences: controlledBy(sandboxv1.GroupVersion.String(), "Sandbox", sb)},
		Spec: *sb.Spec.PodTemplate.Spec.DeepCopy()}
	// Admitted under the namespace's Pod Security level (restricted).
	if err := admin.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if err := admin.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return sb
}

// bindClaim gives claim id the Sandbox sb, as the claim controller's
// adoption does.
func bindClaim(t *testing.T, id string, sb *sandboxv1.Sandbox) {
	t.Helper()
	ctx := context.Background()
	var c extv1.SandboxClaim
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: id}, &c); err != nil {
		t.Fatal(err)
	}
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[extv1.AssignedSandboxNameAnnotation] = sb.Name
	if err := admin.Update(ctx, &c); err != nil {
		t.Fatal(err)
	}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(sb), sb); err != nil {
		t.Fatal(err)
	}
	sb.OwnerReferences = []metav1.OwnerReference{{APIVersion: extv1.GroupVersion.String(), Kind: "SandboxClaim",
		Name: c.Name, UID: c.UID, Controller: ptr.To(true)}}
	delete(sb.Labels, sandboxv1.SandboxWarmPoolLabel)
	if err := admin.Update(ctx, sb); err != nil {
		t.Fatal(err)
	}
}

// waitClaim returns the name of owner's SandboxClaim that is not in skip,
// once one exists.
func waitClaim(t *testing.T, owner string, skip ...string) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var l extv1.SandboxClaimList
		if err := admin.List(context.Background(), &l, client.InNamespace(sandboxNS), client.MatchingLabels{LabelOwner: OwnerLabel(owner)}); err != nil {
			t.Fatal(err)
		}
		for _, c := range l.Items {
			if !slices.Contains(skip, c.Name) {
				return c.Name
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no SandboxClaim of %s", owner)
	return ""
}

// gone reports whether obj no longer exists.
func gone(t *testing.T, obj client.Object) bool {
	t.Helper()
	err := admin.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return apierrors.IsNotFound(err)
}

// TestWarmPoolObjects: with Pool set, the server (as its ServiceAccount)
// makes the pool CA Secret (the CA certificate alone: no key), and for the
// default profile a SandboxTemplate whose pod starts the agent with
// --pool-ca and mounts no sandbox's Secret, and a SandboxWarmPool of that
// size; again with another size, it updates the pool. A create the pool
// can serve becomes a SandboxClaim on it (no Sandbox of its own); one with
// custom limits is a plain Sandbox, as without a pool.
func TestWarmPoolObjects(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	r := newReplica(t, func(c *Config) { c.Pool = 2; c.ReadyTimeout = 3 * time.Second })
	if err := r.b.EnsurePools(ctx); err != nil {
		t.Fatal(err)
	}
	name := PoolName("")
	var sec, caSec corev1.Secret
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: PoolCASecret}, &sec); err != nil {
		t.Fatal(err)
	}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: agenttls.CASecretName}, &caSec); err != nil {
		t.Fatal(err)
	}
	if len(sec.Data) != 1 || string(sec.Data[agenttls.CACertKey]) != string(caSec.Data[agenttls.CACertKey]) {
		t.Errorf("pool CA secret holds %d keys; want the CA certificate alone", len(sec.Data))
	}
	var tmpl extv1.SandboxTemplate
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: name}, &tmpl); err != nil {
		t.Fatal(err)
	}
	ps := tmpl.Spec.PodTemplate.Spec
	if cmd := strings.Join(ps.Containers[0].Command, " "); !strings.Contains(cmd, "--pool-ca "+TLSDir) || strings.Contains(cmd, "--tls-dir") {
		t.Errorf("pooled pod's agent: %s", cmd)
	}
	for _, v := range ps.Volumes {
		if v.Secret != nil && v.Secret.SecretName != PoolCASecret && !strings.HasSuffix(v.Secret.SecretName, "-egress") {
			t.Errorf("pooled pod mounts Secret %s", v.Secret.SecretName)
		}
		if v.Secret != nil && v.Secret.SecretName == PoolCASecret && (len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != agenttls.CACertKey) {
			t.Errorf("pooled pod mounts %+v of the pool CA secret", v.Secret.Items)
		}
	}
	if v, ok := tmpl.Spec.PodTemplate.ObjectMeta.Labels[LabelSandbox]; !ok || v != "" {
		t.Errorf("pooled pod's %s label: %q %v (the NetworkPolicies select on it; the egress proxy ignores it empty)", LabelSandbox, v, ok)
	}
	if tmpl.Spec.NetworkPolicyManagement != extv1.NetworkPolicyManagementUnmanaged {
		t.Errorf("template network policy management: %q", tmpl.Spec.NetworkPolicyManagement)
	}
	wp := func() extv1.SandboxWarmPool {
		var wp extv1.SandboxWarmPool
		if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: name}, &wp); err != nil {
			t.Fatal(err)
		}
		return wp
	}
	if p := wp(); p.Spec.Replicas == nil || *p.Spec.Replicas != 2 || p.Spec.TemplateRef.Name != name {
		t.Errorf("warm pool: %+v", p.Spec)
	}
	r3 := newReplica(t, func(c *Config) { c.Pool = 3 })
	if err := r3.b.EnsurePools(ctx); err != nil {
		t.Fatal(err)
	}
	if p := wp(); *p.Spec.Replicas != 3 {
		t.Errorf("warm pool after a server with --pool 3: %d", *p.Spec.Replicas)
	}

	// Unpooled: custom limits.
	in, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-wpo", Limits: manager.Limits{MemoryBytes: 300 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	getSandbox(t, in.ID)
	if !gone(t, &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: in.ID}}) {
		t.Error("a create with custom limits made a SandboxClaim")
	}
	r.m.Kill(ctx, "key-wpo", in.ID)
	// Pooled: nothing binds the claim here, so the create gives up at
	// ReadyTimeout and releases it.
	_, err = r.m.Create(ctx, manager.CreateRequest{Owner: "key-wpo"})
	if err == nil || !strings.Contains(err.Error(), "warm pool "+name) {
		t.Fatalf("pooled create with no controller: %v", err)
	}
	var l extv1.SandboxClaimList
	if err := admin.List(ctx, &l, client.InNamespace(sandboxNS), client.MatchingLabels{LabelOwner: OwnerLabel("key-wpo")}); err != nil || len(l.Items) != 0 {
		t.Errorf("claims left after the failed create: %d %v", len(l.Items), err)
	}
}

// TestWarmPoolClaim: hostile clients against pooled agents.
//   - an unclaimed pooled pod's agent serves nothing: not to another
//     sandbox's credentials of the same CA, not to the agent protocol in
//     the clear; nor does an unenrolled claim through the API;
//   - a create through the pool becomes a claim, the server enrolls the
//     claimed pod and then serves it to its owner only (through another
//     replica too, one with no pool of its own), and another key's
//     credentials are refused by the agent itself;
//   - a claim of another tenant given a pod that was already claimed (the
//     API records the enrolled pod's address for it: an IP reused, a
//     confused controller) cannot have it: the enrollment is refused, the
//     create fails, its claim and Sandbox are released, and the first
//     owner's sandbox keeps working;
//   - a claim that names a Sandbox another claim controls is refused and
//     released without touching that Sandbox;
//   - a sweep releases no enrolled claim;
//   - a pod the API records in place of the enrolled one is not served as
//     the sandbox;
//   - the server never lowers the pool's size on a claim (the controller
//     refills it; that is for the real-node e2e to show).
func TestWarmPoolClaim(t *testing.T) {
	needEnv(t)
	testserver.NeedRoot(t)
	ctx := context.Background()
	r := newReplica(t, func(c *Config) { c.Pool = 1; c.ReadyTimeout = 90 * time.Second })
	if err := r.b.EnsurePools(ctx); err != nil {
		t.Fatal(err)
	}
	pool := PoolName("")
	ip := randomLoopback()
	pa := startPooledAgent(t, ip)
	sb1 := publishPoolSandbox(t, pool, ip)
	addr := net.JoinHostPort(ip, strconv.Itoa(AgentPort))

	// Another sandbox's credentials, of the same CA (an unpooled one).
	other, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-wp-b", Limits: manager.Limits{MemoryBytes: 300 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.m.Kill(ctx, "key-wp-b", other.ID)
	var otherSec corev1.Secret
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: agenttls.SecretName(other.ID)}, &otherSec); err != nil {
		t.Fatal(err)
	}
	otherCreds, err := agenttls.NewClientCreds(other.ID, otherSec.Data)
	if err != nil {
		t.Fatal(err)
	}
	hostile := func(when string) {
		t.Helper()
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if c, err := agenttls.Dial(dctx, addr, otherCreds); err == nil {
			c.Close()
			t.Errorf("%s: another sandbox's credentials reached the pooled agent", when)
		}
		raw, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		raw.SetDeadline(time.Now().Add(30 * time.Second))
		if ac, err := agent.NewClient(raw); err == nil {
			ac.Close()
			t.Errorf("%s: the agent protocol in the clear was served", when)
		}
		raw.Close()
	}
	hostile("unclaimed")

	type created struct {
		in  manager.Info
		err error
	}
	create := func(owner string) chan created {
		res := make(chan created, 1)
		go func() {
			in, err := r.m.Create(ctx, manager.CreateRequest{Owner: owner})
			res <- created{in, err}
		}()
		return res
	}
	resA := create("key-wp-a")
	idA := waitClaim(t, "key-wp-a")
	t.Cleanup(func() { r.b.releaseClaim(context.Background(), idA) })
	if getSandboxErr := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: idA}, &sandboxv1.Sandbox{}); !apierrors.IsNotFound(getSandboxErr) {
		t.Errorf("a pooled create made a Sandbox of its own: %v", getSandboxErr)
	}
	// Claimed, not yet enrolled: nothing through the API, to anyone.
	if _, err := r.m.Lookup("key-wp-a", idA); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("lookup of an unenrolled claim: %v", err)
	}
	if l, err := r.m.List(ctx, "key-wp-a", manager.ListOptions{}); err != nil || len(l) != 0 {
		t.Errorf("list with an unenrolled claim: %+v %v", l, err)
	}
	bindClaim(t, idA, sb1)
	a := <-resA
	if a.err != nil || a.in.ID != idA {
		t.Fatalf("pooled create: %+v %v", a.in, a.err)
	}
	sbA, err := r.m.Lookup("key-wp-a", idA)
	if err != nil {
		t.Fatal(err)
	}
	if got := execOut(t, sbA.Agent(), pa.work, "echo mine > f; id -u"); got != strconv.Itoa(sandboxUID)+"\n" {
		t.Errorf("exec in the claimed pod: %q", got)
	}
	// Another replica, with no pool configured, serves it from the claim.
	r2 := newReplica(t, nil)
	sb2, err := r2.m.Lookup("key-wp-a", idA)
	if err != nil {
		t.Fatalf("lookup through a second replica: %v", err)
	}
	if got := execOut(t, sb2.Agent(), pa.work, "cat f"); got != "mine\n" {
		t.Errorf("second replica reads %q", got)
	}
	if l, err := r2.m.List(ctx, "key-wp-a", manager.ListOptions{}); err != nil || len(l) != 1 || l[0].ID != idA {
		t.Errorf("list through the second replica: %+v %v", l, err)
	}
	for _, rr := range []*replica{r, r2} {
		if _, err := rr.m.Lookup("key-wp-b", idA); !errors.Is(err, manager.ErrNotFound) {
			t.Errorf("another key's lookup of the claimed sandbox: %v", err)
		}
		if err := rr.m.Kill(ctx, "key-wp-b", idA); !errors.Is(err, manager.ErrNotFound) {
			t.Errorf("another key's kill of the claimed sandbox: %v", err)
		}
	}
	hostile("claimed")
	// A sweep that would release any unenrolled claim at once leaves the
	// enrolled one alone.
	sweeper := newReplica(t, func(c *Config) { c.ReadyTimeout = time.Millisecond })
	sweeper.b.sweepGrace = 0
	if _, err := sweeper.b.SweepClaims(ctx); err != nil {
		t.Fatal(err)
	}
	if gone(t, &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: idA}}) {
		t.Fatal("the sweep released an enrolled claim")
	}
	if got := execOut(t, sbA.Agent(), pa.work, "cat f"); got != "mine\n" {
		t.Errorf("after the sweep: %q", got)
	}
	if _, err := r.m.Pause(ctx, "key-wp-a", idA); !errors.Is(err, manager.ErrPolicy) {
		t.Errorf("pause of a pooled sandbox: %v, want refused", err)
	}

	// Tenant B's claim is given a Sandbox whose pod the API places at the
	// enrolled agent's address.
	resB := create("key-wp-b")
	idB := waitClaim(t, "key-wp-b")
	t.Cleanup(func() { r.b.releaseClaim(context.Background(), idB) })
	sbB := publishPoolSandbox(t, pool, ip)
	bindClaim(t, idB, sbB)
	b := <-resB
	if b.err == nil || !errors.Is(b.err, agenttls.ErrEnrollRefused) {
		t.Fatalf("create of tenant b on a claimed pod: %+v %v, want the enrollment refused", b.in, b.err)
	}
	for what, obj := range map[string]client.Object{
		"claim":   &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: idB}},
		"Secret":  &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: agenttls.SecretName(idB)}},
		"Sandbox": &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: sbB.Name}},
	} {
		if !gone(t, obj) {
			t.Errorf("tenant b's %s left after the refused enrollment", what)
		}
	}
	if _, err := r.m.Lookup("key-wp-b", idB); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("tenant b's lookup: %v", err)
	}
	if got := execOut(t, sbA.Agent(), pa.work, "cat f"); got != "mine\n" {
		t.Errorf("owner a after tenant b's attempt: %q", got)
	}
	var wp extv1.SandboxWarmPool
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: pool}, &wp); err != nil || *wp.Spec.Replicas != 1 {
		t.Errorf("warm pool after claims: %v %v", wp.Spec.Replicas, err)
	}
	// Tenant D's claim names A's Sandbox (a stale or forged assignment)
	// while the Sandbox stays A's claim's: refused at once by the chain of
	// controllers, D's claim released, A's Sandbox kept.
	resD := create("key-wp-d")
	idD := waitClaim(t, "key-wp-d")
	t.Cleanup(func() { r.b.releaseClaim(context.Background(), idD) })
	var claimD extv1.SandboxClaim
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: idD}, &claimD); err != nil {
		t.Fatal(err)
	}
	claimD.Annotations[extv1.AssignedSandboxNameAnnotation] = sb1.Name
	if err := admin.Update(ctx, &claimD); err != nil {
		t.Fatal(err)
	}
	if d := <-resD; d.err == nil || !errors.Is(d.err, errNotOurs) {
		t.Fatalf("create of tenant d on A's Sandbox: %+v %v, want refused (not the claim's)", d.in, d.err)
	}
	if !gone(t, &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: idD}}) {
		t.Error("tenant d's claim left")
	}
	if gone(t, &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: sb1.Name}}) {
		t.Fatal("releasing tenant d's claim deleted A's Sandbox")
	}
	if got := execOut(t, sbA.Agent(), pa.work, "cat f"); got != "mine\n" {
		t.Errorf("owner a after tenant d's attempt: %q", got)
	}

	// Tenant C's claim finds the pool empty: the claim controller makes
	// a Sandbox of the template named by the claim (its cold path) and
	// records it in the claim's status only.
	resC := create("key-wp-c")
	idC := waitClaim(t, "key-wp-c")
	t.Cleanup(func() { r.b.releaseClaim(context.Background(), idC) })
	ipC := randomLoopback()
	paC := startPooledAgent(t, ipC)
	var claimC extv1.SandboxClaim
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: idC}, &claimC); err != nil {
		t.Fatal(err)
	}
	sbC := publishSandbox(t, pool, ipC, metav1.ObjectMeta{Name: idC,
		OwnerReferences: controlledBy(extv1.GroupVersion.String(), "SandboxClaim", &claimC)})
	claimC.Status.SandboxStatus.Name = sbC.Name
	if err := admin.Status().Update(ctx, &claimC); err != nil {
		t.Fatal(err)
	}
	if c := <-resC; c.err != nil || c.in.ID != idC {
		t.Fatalf("pooled create served cold: %+v %v", c.in, c.err)
	}
	sbCc, err := r2.m.Lookup("key-wp-c", idC)
	if err != nil {
		t.Fatalf("lookup of the cold-served claim (its Sandbox has its name): %v", err)
	}
	if got := execOut(t, sbCc.Agent(), paC.work, "echo cold"); got != "cold\n" {
		t.Errorf("exec in the cold-served claim: %q", got)
	}
	if _, err := r2.m.Lookup("key-wp-a", idC); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("another key's lookup of the cold-served claim: %v", err)
	}
	if err := r.m.Kill(ctx, "key-wp-c", idC); err != nil {
		t.Fatal(err)
	}
	if !gone(t, &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: idC}}) {
		t.Error("the cold-served claim's Sandbox left after kill")
	}

	// The API records a new pod for A's Sandbox (the first one died and
	// the controller made another): it is an unenrolled pooled agent in a
	// real cluster, so no replica may take it for A's, even where the old
	// agent still answers at its address.
	var oldPod corev1.Pod
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: sb1.Name}, &oldPod); err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete(ctx, &oldPod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	for !gone(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: sb1.Name}}) {
		time.Sleep(100 * time.Millisecond)
	}
	newPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: oldPod.Name, Namespace: sandboxNS, Labels: oldPod.Labels,
		Annotations: oldPod.Annotations, OwnerReferences: oldPod.OwnerReferences}, Spec: oldPod.Spec}
	if err := admin.Create(ctx, newPod); err != nil {
		t.Fatal(err)
	}
	newPod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if err := admin.Status().Update(ctx, newPod); err != nil {
		t.Fatal(err)
	}
	if _, err := newReplica(t, nil).m.Lookup("key-wp-a", idA); !errors.Is(err, manager.ErrNotRunning) || !strings.Contains(err.Error(), "replaced since its enrollment") {
		t.Errorf("lookup of a pooled sandbox whose pod was replaced: %v, want not running", err)
	}

	// Kill: the claim, its Sandbox and Secret go.
	if err := r2.m.Kill(ctx, "key-wp-a", idA); err != nil {
		t.Fatal(err)
	}
	for what, obj := range map[string]client.Object{
		"claim":   &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: idA}},
		"Secret":  &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: agenttls.SecretName(idA)}},
		"Sandbox": &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: sb1.Name}},
	} {
		if !gone(t, obj) {
			t.Errorf("%s left after kill", what)
		}
	}
}

// TestServePoolKilledBeforeEnrollment: `airlock serve --backend kubernetes
// --pool 1` killed with SIGKILL after a create's claim was bound and its
// Secret written, before the enrollment (the claimed pod's agent does not
// answer yet): the claim is left unmarked and serves nothing; another
// server started afterwards releases it (claim, Secret and the Sandbox it
// was given), so nothing is left half-enrolled. Then a server serves a
// pooled create, exec and kill through its API.
func TestServePoolKilledBeforeEnrollment(t *testing.T) {
	needEnv(t)
	testserver.NeedRoot(t)
	kc := writeKubeconfig(t, serverCfg)
	// Its create waits for the enrollment far longer than this test needs
	// to kill it (under any load).
	a := startServe(t, kc, "--pool", "1", "--kube-ready-timeout", "10m")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := alclient.New(a.url, "").Create(ctx, alclient.CreateRequest{})
		errc <- err
	}()
	id := waitClaim(t, "") // --no-auth: the owner is ""
	t.Cleanup(func() { newReplica(t, nil).b.releaseClaim(context.Background(), id) })
	// Bound to a pod whose agent is not listening yet.
	sb := publishPoolSandbox(t, PoolName(""), randomLoopback())
	bindClaim(t, id, sb)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: agenttls.SecretName(id)}}
	for deadline := time.Now().Add(time.Minute); gone(t, secret) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	a.kill()
	if err := <-errc; err == nil {
		t.Fatal("the create succeeded with no agent to enroll")
	}
	claim := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: id}}
	if gone(t, claim) || gone(t, secret) {
		t.Fatal("the claim or its Secret was gone before the restart: the kill did not land between the claim and the enrollment")
	}
	if claim.Annotations[AnnotationEnrolledPod] != "" {
		t.Fatal("the claim was marked enrolled")
	}
	// Meanwhile it serves nothing.
	if _, err := newReplica(t, nil).m.Lookup("", id); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("lookup of the half-made sandbox: %v", err)
	}
	b := startServe(t, kc, "--pool", "1", "--kube-ready-timeout", "2s")
	deadline := time.Now().Add(2 * time.Minute)
	for !(gone(t, claim) && gone(t, secret) && gone(t, &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: sb.Name}})) {
		if time.Now().After(deadline) {
			t.Fatalf("the restarted server left the claim %s (gone %v), its Secret (gone %v) or Sandbox %s; log:\n%s",
				id, gone(t, claim), gone(t, secret), sb.Name, b.logs())
		}
		time.Sleep(250 * time.Millisecond)
	}
	if !strings.Contains(b.logs(), "released SandboxClaim "+id) {
		t.Errorf("the restarted server did not log the release:\n%s", b.logs())
	}

	// A server serves a pooled create through its API: 201 once the
	// claimed pod's agent is enrolled and answers its token. (Not b: its
	// 2 s ready timeout, and so its sweep, are too short for a loaded
	// machine.)
	b.kill()
	c := startServe(t, kc, "--pool", "1")
	ip := randomLoopback()
	pa := startPooledAgent(t, ip)
	warm := publishPoolSandbox(t, PoolName(""), ip)
	cb := alclient.New(c.url, "")
	res := make(chan error, 1)
	var made *alclient.Sandbox
	go func() {
		var err error
		made, err = cb.Create(ctx, alclient.CreateRequest{})
		res <- err
	}()
	id2 := waitClaim(t, "", id)
	t.Cleanup(func() { newReplica(t, nil).b.releaseClaim(context.Background(), id2) })
	bindClaim(t, id2, warm)
	if err := <-res; err != nil || made.ID != id2 {
		t.Fatalf("pooled create through serve: %+v %v\n%s", made, err, c.logs())
	}
	r, err := cb.Exec(ctx, id2, alclient.ExecRequest{Shell: "echo pooled; id -u", Cwd: pa.work})
	if err != nil || r.ExitCode != 0 || r.Stdout != "pooled\n1000\n" {
		t.Errorf("exec in the pooled sandbox: %+v %v", r, err)
	}
	if err := cb.Kill(ctx, id2); err != nil {
		t.Fatal(err)
	}
	if !gone(t, &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: id2}}) {
		t.Error("the claim left after kill")
	}
}

// TestWarmPoolMarkEnrolledConflict: the mark "enrolled" is written on the
// claim as read when its pod was found; when the claim controller has
// written the claim since (its status), the server reads it again and
// marks it if it still leads to the same pod, and refuses if it now leads
// to another.
func TestWarmPoolMarkEnrolledConflict(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	r := newReplica(t, func(c *Config) { c.Pool = 1 })
	if err := r.b.EnsurePools(ctx); err != nil {
		t.Fatal(err)
	}
	pool := PoolName("")
	id := "sb-" + fmt.Sprintf("%016x", rand.Uint64())
	claim := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: sandboxNS,
		Labels: map[string]string{LabelSandbox: id, LabelManagedBy: ManagedBy}}, Spec: extv1.SandboxClaimSpec{WarmPoolRef: extv1.SandboxWarmPoolRef{Name: pool}}}
	if err := admin.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.b.releaseClaim(context.Background(), id) })
	sb1 := publishPoolSandbox(t, pool, randomLoopback())
	bindClaim(t, id, sb1)
	stale := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: sandboxNS}}
	pod, err := r.b.claimedPod(ctx, stale)
	if err != nil {
		t.Fatal(err)
	}
	// The controller writes the claim's status meanwhile.
	var fresh extv1.SandboxClaim
	if err := admin.Get(ctx, client.ObjectKeyFromObject(claim), &fresh); err != nil {
		t.Fatal(err)
	}
	fresh.Status.SandboxStatus.Name = sb1.Name
	if err := admin.Status().Update(ctx, &fresh); err != nil {
		t.Fatal(err)
	}
	if err := r.b.markEnrolled(ctx, stale.DeepCopy(), pod); err != nil {
		t.Fatalf("mark after a status write: %v", err)
	}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(claim), &fresh); err != nil || fresh.Annotations[AnnotationEnrolledPod] != string(pod.UID) {
		t.Fatalf("claim not marked: %v %v", fresh.Annotations, err)
	}
	// Given another Sandbox meanwhile: refused.
	sb2 := publishPoolSandbox(t, pool, randomLoopback())
	if err := admin.Get(ctx, client.ObjectKeyFromObject(claim), &fresh); err != nil {
		t.Fatal(err)
	}
	fresh.Status.SandboxStatus.Name = ""
	if err := admin.Status().Update(ctx, &fresh); err != nil {
		t.Fatal(err)
	}
	bindClaim(t, id, sb2)
	if err := r.b.markEnrolled(ctx, stale.DeepCopy(), pod); !errors.Is(err, errNotOurs) {
		t.Fatalf("mark of a claim now given another pod: %v, want refused", err)
	}
}
