package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-dev/airlock/internal/spans"
	"github.com/airlock-dev/airlock/kube/agenttls"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
)

// Warm pools in the cluster (docs/kubernetes.md, "Warm pools").
//
// For each pooled profile the backend keeps a SandboxTemplate and a
// SandboxWarmPool (agent-sandbox's extensions API) named PoolName(profile):
// agent-sandbox's controller keeps that many Sandboxes of the template
// running, each a pod whose agent was started with --pool-ca (the cluster
// CA's certificate alone, from the Secret PoolCASecret) and so serves
// nothing until enrolled. A create the pool can serve (the default image,
// the native tier, no secrets, and a pod exactly the template's) becomes a
// SandboxClaim named by the sandbox's id, referring to the pool; the
// controller hands it one of the pool's Sandboxes (or makes one from the
// template when the pool is empty) and refills the pool. The server then
// checks the chain claim -> Sandbox -> pod in the API (controller owner
// references), writes the sandbox's Secret, enrolls the pod's agent at the
// pod IP the API records (agenttls.Enroller) and only then marks the claim
// enrolled (AnnotationEnrolledPod, the pod's UID): a claim without the
// mark serves nothing to anyone, and one older than ReadyTimeout is
// released by the sweep (a server killed between the claim and the
// enrollment), with the Sandbox it was given. A pooled pod serves only the
// pod UID its claim recorded; a pod replaced under a claim is never
// enrolled again.

// PoolCASecret holds the cluster CA's certificate alone (ca.crt: public),
// mounted into pooled pods.
const PoolCASecret = "airlock-pool-ca"

// Annotations of a pooled sandbox's SandboxClaim.
const (
	// AnnotationPool names the SandboxWarmPool a claim draws on; a
	// sandbox whose record has it is a pooled one.
	AnnotationPool = "airlock.dev/pool"
	// AnnotationEnrolledPod is the UID of the pod the server enrolled for
	// the claim; without it the claim serves nothing.
	AnnotationEnrolledPod = "airlock.dev/enrolled-pod"
	// AnnotationEnrolledPodName is that pod's name.
	AnnotationEnrolledPodName = "airlock.dev/enrolled-pod-name"
)

// LabelPool labels the pods (and pod templates) of a warm pool with its
// name.
const LabelPool = "airlock.dev/pool"

// sweepGrace is added to ReadyTimeout before the sweep releases a claim
// that was never enrolled: its creator gives up at ReadyTimeout.
const sweepGrace = 15 * time.Second

// PoolName is the name of the SandboxTemplate and SandboxWarmPool of a
// profile ("" is the default profile, strict).
func PoolName(profile string) string {
	if profile == "" {
		profile = string(policy.Strict)
	}
	return "airlock-pool-" + profile
}

// poolPolicy is the policy of a pooled profile's sandboxes: that of a
// create naming only the profile.
func poolPolicy(profile string) (policy.Policy, error) {
	p, err := manager.DefaultPolicy(profile)
	if err != nil {
		return p, fmt.Errorf("kube: pool profile: %w", err)
	}
	if m := p.Network.Mode; m != "" && m != policy.NetNone {
		return p, fmt.Errorf("kube: pool profile %q has network %q: pooled pods are made before their sandbox, so only network none can be pooled", profile, m)
	}
	return p, nil
}

// poolPod is the pod template of a pooled profile's sandboxes.
func (b *Backend) poolPod(p policy.Policy) (sandboxv1.PodTemplate, error) {
	ps, err := podSpec(podParams{policy: p, image: b.cfg.DefaultImage, agentImage: b.cfg.AgentImage, env: p.Env, pooled: true})
	if err != nil {
		return sandboxv1.PodTemplate{}, err
	}
	network, err := json.Marshal(p.Network)
	if err != nil {
		return sandboxv1.PodTemplate{}, fmt.Errorf("kube: network: %w", err)
	}
	// LabelSandbox is present (the NetworkPolicies select sandbox pods by
	// it) but empty: the egress proxy ignores such pods, and the claim
	// may not change it (agent-sandbox refuses to override a template's
	// label).
	return sandboxv1.PodTemplate{Spec: ps, ObjectMeta: sandboxv1.PodMetadata{
		Labels:      map[string]string{LabelSandbox: "", LabelManagedBy: ManagedBy, LabelPool: PoolName(string(p.Profile))},
		Annotations: map[string]string{AnnotationNetwork: string(network)}}}, nil
}

// EnsurePools makes (or updates) the pool CA Secret and each pooled
// profile's SandboxTemplate and SandboxWarmPool of Config.Pool sandboxes.
// Every replica may run it at start.
func (b *Backend) EnsurePools(ctx context.Context) error {
	if !b.pooling() {
		return nil
	}
	ca, err := b.caSecret(ctx)
	if err != nil {
		return err
	}
	if err := b.ensurePoolCA(ctx, ca.CertPEM()); err != nil {
		return err
	}
	for _, profile := range b.cfg.PoolProfiles {
		p, err := poolPolicy(profile)
		if err != nil {
			return err
		}
		pod, err := b.poolPod(p)
		if err != nil {
			return err
		}
		name := PoolName(profile)
		meta := metav1.ObjectMeta{Name: name, Namespace: b.cfg.Namespace, Labels: map[string]string{LabelManagedBy: ManagedBy, LabelPool: name}}
		tmpl := &extv1.SandboxTemplate{ObjectMeta: meta, Spec: extv1.SandboxTemplateSpec{
			SandboxBlueprint: sandboxv1.SandboxBlueprint{PodTemplate: pod},
			// The NetworkPolicies of deploy/airlock confine sandbox pods;
			// agent-sandbox's own would allow DNS and the internet.
			NetworkPolicyManagement: extv1.NetworkPolicyManagementUnmanaged,
			EnvVarsInjectionPolicy:  extv1.EnvVarsInjectionPolicyDisallowed,
		}}
		if err := b.createOrPatch(ctx, tmpl, map[string]any{"spec": tmpl.Spec}); err != nil {
			return err
		}
		pool := &extv1.SandboxWarmPool{ObjectMeta: *meta.DeepCopy(), Spec: extv1.SandboxWarmPoolSpec{
			Replicas: ptr.To(int32(b.cfg.Pool)), TemplateRef: extv1.SandboxTemplateRef{Name: name}}}
		if err := b.createOrPatch(ctx, pool, map[string]any{"spec": map[string]any{"replicas": b.cfg.Pool,
			"sandboxTemplateRef": map[string]any{"name": name}}}); err != nil {
			return err
		}
		b.cfg.Logf("kubernetes: warm pool %s/%s: %d pods of profile %s; this server reserves %d", b.cfg.Namespace, name, b.cfg.Pool, p.Profile, b.cfg.Reserve)
	}
	return nil
}

// createOrPatch creates obj, or merge-patches spec into the existing one.
func (b *Backend) createOrPatch(ctx context.Context, obj client.Object, spec map[string]any) error {
	kind := fmt.Sprintf("%T", obj)
	err := b.c.Create(ctx, obj)
	if err == nil || !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("kube: create %s %s: %w", kind, obj.GetName(), err)
		}
		return nil
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := b.c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, data)); err != nil {
		return fmt.Errorf("kube: update %s %s: %w", kind, obj.GetName(), err)
	}
	return nil
}

// ensurePoolCA makes the Secret PoolCASecret hold caPEM alone; one of
// another CA (airlock-ca was rotated) is replaced.
func (b *Backend) ensurePoolCA(ctx context.Context, caPEM []byte) error {
	key := client.ObjectKey{Namespace: b.cfg.Namespace, Name: PoolCASecret}
	for range 3 {
		var s corev1.Secret
		err := b.c.Get(ctx, key, &s)
		switch {
		case err == nil && len(s.Data) == 1 && string(s.Data[agenttls.CACertKey]) == string(caPEM):
			return nil
		case err == nil:
			if err := b.c.Delete(ctx, &s); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("kube: replace the pool CA secret: %w", err)
			}
			continue
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("kube: read the pool CA secret: %w", err)
		}
		s = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace,
			Labels: map[string]string{LabelManagedBy: ManagedBy}}, Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{agenttls.CACertKey: caPEM}, Immutable: ptr.To(true)}
		if err := b.c.Create(ctx, &s); err == nil || !apierrors.IsAlreadyExists(err) {
			if err != nil {
				return fmt.Errorf("kube: create the pool CA secret: %w", err)
			}
			return nil
		}
	}
	return errors.New("kube: the pool CA secret keeps changing")
}

// poolFor returns the pool that can serve spec ("" if none): the default
// image, the native tier, no secrets, a pooled profile, and a pod equal
// to the pool's template (same limits, user, environment, network).
func (b *Backend) poolFor(spec manager.RemoteSpec, env []string) string {
	if !b.pooling() || len(spec.Secrets) > 0 || (spec.Image != "" && spec.Image != b.cfg.DefaultImage) ||
		spec.Runtime != RuntimeNative || b.cfg.RuntimeClasses[RuntimeNative] != "" {
		return ""
	}
	profile := string(spec.Policy.Profile)
	if profile == string(policy.Strict) {
		profile = ""
	}
	pooled := false
	for _, pr := range b.cfg.PoolProfiles {
		if pr == profile || (pr == string(policy.Strict) && profile == "") {
			pooled, profile = true, pr
		}
	}
	if !pooled {
		return ""
	}
	p, err := poolPolicy(profile)
	if err != nil {
		return ""
	}
	want, err := b.poolPod(p)
	if err != nil {
		return ""
	}
	got, err := b.poolPod(spec.Policy)
	if err != nil {
		return ""
	}
	got.Spec.Containers[0].Env = nil
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		got.Spec.Containers[0].Env = append(got.Spec.Containers[0].Env, corev1.EnvVar{Name: k, Value: v})
	}
	if !equality.Semantic.DeepEqual(want.Spec, got.Spec) || want.ObjectMeta.Annotations[AnnotationNetwork] != got.ObjectMeta.Annotations[AnnotationNetwork] {
		return ""
	}
	return PoolName(profile)
}

// createPooled is Create through the warm pool: a SandboxClaim, the
// sandbox's Secret, the enrollment of the pod the claim was given, then
// the mark that it is enrolled. Any failure releases the claim.
//
// A sandbox of this process's reserve (reserve.go) is used first: then
// ready is true (its agent is enrolled and connected already).
func (b *Backend) createPooled(ctx context.Context, spec manager.RemoteSpec, pool string, labels, ann map[string]string, sp *spans.Spans) (sb *sandboxv1.Sandbox, ready bool, err error) {
	if r := b.take(pool); r != nil {
		ann = cloneMap(ann)
		ann[AnnotationPool] = pool
		sb, err := b.assignReserved(ctx, r, spec, labels, ann)
		sp.Mark("assign_reserved")
		if err == nil {
			return sb, true, nil
		}
		b.cfg.Logf("kubernetes: %v; claiming afresh", err)
	}
	sb, err = b.claimPooled(ctx, spec, pool, labels, ann, sp)
	return sb, false, err
}

// claimPooled is createPooled without the reserve: a SandboxClaim of its
// own.
func (b *Backend) claimPooled(ctx context.Context, spec manager.RemoteSpec, pool string, labels, ann map[string]string, sp *spans.Spans) (*sandboxv1.Sandbox, error) {
	ca, err := b.caSecret(ctx)
	if err != nil {
		return nil, err
	}
	enroller, err := b.enroller(ca)
	if err != nil {
		return nil, err
	}
	bundle, err := ca.Issue(spec.ID, 0)
	if err != nil {
		return nil, err
	}
	ann = cloneMap(ann)
	ann[AnnotationPool] = pool
	claim := &extv1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: spec.ID, Namespace: b.cfg.Namespace, Labels: labels, Annotations: ann},
		Spec: extv1.SandboxClaimSpec{
			WarmPoolRef: extv1.SandboxWarmPoolRef{Name: pool},
			Lifecycle: &extv1.Lifecycle{ShutdownTime: ptr.To(metav1.NewTime(spec.ExpiresAt)),
				ShutdownPolicy: extv1.ShutdownPolicyDelete},
			// No AdditionalPodMetadata: agent-sandbox accepts only labels
			// of its allowlisted domains there, and the pod needs none (the
			// claim is the record; the pod is known by its controllers).
		},
	}
	sp.Mark("issue")
	if err := b.c.Create(ctx, claim); err != nil {
		return nil, fmt.Errorf("kube: create SandboxClaim %s: %w", spec.ID, err)
	}
	sp.Mark("claim_create")
	release := func(err error) (*sandboxv1.Sandbox, error) {
		if rerr := b.releaseClaim(context.WithoutCancel(ctx), spec.ID); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: agenttls.SecretName(spec.ID), Namespace: b.cfg.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: extv1.GroupVersion.String(), Kind: "SandboxClaim",
				Name: claim.Name, UID: claim.UID}}},
		Type: corev1.SecretTypeOpaque, Data: bundle.SecretData(), Immutable: ptr.To(true),
	}
	if err := b.c.Create(ctx, secret); err != nil {
		return release(fmt.Errorf("kube: create Secret of %s: %w", spec.ID, err))
	}
	sp.Mark("secret_create")
	wctx, cancel := context.WithTimeout(ctx, b.cfg.ReadyTimeout)
	defer cancel()
	pod, err := b.enroll(wctx, claim, enroller, bundle, 5*time.Millisecond, sp)
	if err != nil {
		return release(fmt.Errorf("kube: sandbox %s from warm pool %s: %w", spec.ID, pool, err))
	}
	if err := b.markEnrolled(wctx, claim, pod); err != nil {
		return release(fmt.Errorf("kube: mark SandboxClaim %s enrolled: %w", spec.ID, err))
	}
	sp.Mark("mark_enrolled")
	return claimSandbox(claim), nil
}

// markEnrolled records pod, just enrolled, on claim (as read when pod was
// found), guarded by the claim's resourceVersion. The claim controller
// writes the claim too (its status): on a conflict the claim is read
// again, and marked only if it still leads to the same pod.
//
// A conflict is usually the controller's status write just after the
// bind: when the claim read again (one read, not the chain's three) still
// names the same Sandbox, it is patched again at once (the pod recorded is
// the one enrolled, checked by UID whenever the sandbox is served, and an
// enrolled agent refuses any other enrollment); otherwise the whole chain
// is read again and the mark refused if it leads elsewhere.
func (b *Backend) markEnrolled(ctx context.Context, claim *extv1.SandboxClaim, pod *corev1.Pod) error {
	bound := assignedSandbox(claim)
	for {
		data, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": claim.ResourceVersion,
			"annotations": map[string]string{AnnotationEnrolledPod: string(pod.UID), AnnotationEnrolledPodName: pod.Name}}})
		if err != nil {
			return err
		}
		err = b.c.Patch(ctx, claim, client.RawPatch(types.MergePatchType, data))
		if err == nil || !apierrors.IsConflict(err) {
			return err
		}
		var again extv1.SandboxClaim
		if err := b.c.Get(ctx, client.ObjectKeyFromObject(claim), &again); err != nil {
			return fmt.Errorf("the claim changed during the enrollment: %w", err)
		}
		if bound != "" && assignedSandbox(&again) == bound && again.UID == claim.UID && again.DeletionTimestamp.IsZero() {
			*claim = again
			continue
		}
		now, err := b.claimedPod(ctx, claim)
		if err != nil {
			return fmt.Errorf("the claim changed during the enrollment: %w", err)
		}
		if now.UID != pod.UID {
			return fmt.Errorf("%w: the claim now leads to pod %s (%s), not the enrolled %s (%s)", errNotOurs, now.Name, now.UID, pod.Name, pod.UID)
		}
	}
}

// enroller returns this process's enroller of ca's pooled agents.
func (b *Backend) enroller(ca *agenttls.CA) (*agenttls.Enroller, error) {
	b.caMu.Lock()
	defer b.caMu.Unlock()
	if b.enr != nil && b.enrCA == ca && time.Until(b.enrUntil) > time.Hour {
		return b.enr, nil
	}
	e, err := ca.Enroller(24 * time.Hour)
	if err != nil {
		return nil, err
	}
	b.enr, b.enrCA, b.enrUntil = e, ca, time.Now().Add(24*time.Hour)
	return e, nil
}

// enroll waits for claim to be given a Sandbox whose pod runs, checks the
// chain of controllers claim -> Sandbox -> pod, and enrolls the pod's agent
// with bundle at the pod IP the API records. It updates claim to the
// version read when bound.
//
// The claim controller binds a warm Sandbox within milliseconds: the first
// polls follow closely, from wait (a fixed 200 ms made every pooled create
// wait at least that long), then back off to 200 ms.
func (b *Backend) enroll(ctx context.Context, claim *extv1.SandboxClaim, e *agenttls.Enroller, bundle *agenttls.Bundle, wait time.Duration, sp *spans.Spans) (*corev1.Pod, error) {
	var last error
	polls := 0
	for {
		polls++
		pod, err := b.claimedPod(ctx, claim)
		if err == nil {
			sp.Mark("bound")
			sp.Add("polls", polls)
			err = e.Enroll(ctx, net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(b.port)), bundle)
			sp.Mark("enroll")
			if err == nil {
				return pod, nil
			}
			if errors.Is(err, agenttls.ErrEnrollRefused) {
				// Enrolled already (for another claim), or of another
				// CA: this pod can never be the claim's.
				return nil, err
			}
		}
		if errors.Is(err, errNotOurs) {
			return nil, err
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("not enrolled within %s: %w", b.cfg.ReadyTimeout, last)
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// errNotOurs marks a claimed Sandbox or pod that is not the claim's.
var errNotOurs = errors.New("not the claim's")

// claimedPod reads claim (into claim), its Sandbox and that Sandbox's pod,
// and returns the pod if it runs with an IP and the controllers chain up
// to the claim.
func (b *Backend) claimedPod(ctx context.Context, claim *extv1.SandboxClaim) (*corev1.Pod, error) {
	if err := b.c.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
		return nil, fmt.Errorf("read the claim: %w", err)
	}
	name := assignedSandbox(claim)
	if name == "" {
		return nil, errors.New("the claim has no Sandbox yet")
	}
	var sb sandboxv1.Sandbox
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: b.cfg.Namespace, Name: name}, &sb); err != nil {
		return nil, fmt.Errorf("read the claim's Sandbox %s: %w", name, err)
	}
	switch ref := metav1.GetControllerOf(&sb); {
	case ref != nil && ref.UID == claim.UID:
	case ref == nil || ref.Kind == "SandboxWarmPool":
		// The claim controller names the Sandbox on the claim first and
		// then moves the Sandbox from the pool to the claim: wait.
		return nil, fmt.Errorf("the Sandbox %s is not adopted by the claim yet", name)
	default:
		return nil, fmt.Errorf("%w: Sandbox %s is controlled by %s %s", errNotOurs, name, ref.Kind, ref.Name)
	}
	podName := sb.Name
	if n := sb.Annotations[sandboxv1.SandboxPodNameAnnotation]; n != "" {
		podName = n
	}
	var pod corev1.Pod
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: b.cfg.Namespace, Name: podName}, &pod); err != nil {
		return nil, fmt.Errorf("read the pod %s: %w", podName, err)
	}
	if ref := metav1.GetControllerOf(&pod); ref == nil || ref.UID != sb.UID {
		return nil, fmt.Errorf("%w: pod %s is not controlled by Sandbox %s (%v)", errNotOurs, podName, name, ref)
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" || !pod.DeletionTimestamp.IsZero() {
		return nil, fmt.Errorf("pod %s is %s", podName, pod.Status.Phase)
	}
	return &pod, nil
}

// assignedSandbox is the name of the Sandbox the claim controller gave
// claim ("" if none yet): its annotation, or its status on the cold path.
func assignedSandbox(claim *extv1.SandboxClaim) string {
	if name := claim.Annotations[extv1.AssignedSandboxNameAnnotation]; name != "" {
		return name
	}
	return claim.Status.SandboxStatus.Name
}

// claimSandbox is the record of a pooled sandbox as the rest of the
// backend reads sandboxes: a Sandbox named by the id, with the claim's
// labels, annotations and shutdown time, and the pod template of its pool.
func claimSandbox(c *extv1.SandboxClaim) *sandboxv1.Sandbox {
	sb := &sandboxv1.Sandbox{ObjectMeta: *c.ObjectMeta.DeepCopy()}
	sb.Spec.OperatingMode = sandboxv1.SandboxOperatingModeRunning
	if c.Spec.Lifecycle != nil {
		sb.Spec.ShutdownTime = c.Spec.Lifecycle.ShutdownTime
	}
	if sb.Annotations == nil {
		sb.Annotations = map[string]string{}
	}
	if n := c.Annotations[AnnotationEnrolledPodName]; n != "" {
		sb.Annotations[sandboxv1.SandboxPodNameAnnotation] = n
	}
	var p policy.Policy
	if json.Unmarshal([]byte(c.Annotations[AnnotationPolicy]), &p) == nil {
		if ps, err := podSpec(podParams{policy: p, image: "-", agentImage: "-", pooled: true}); err == nil {
			sb.Spec.PodTemplate.Spec = ps
		}
	}
	return sb
}

// pooled reports whether sb is the record of a pooled sandbox.
func pooled(sb *sandboxv1.Sandbox) bool { return sb.Annotations[AnnotationPool] != "" }

// enrolled reports whether sb is not a pooled sandbox still being enrolled.
func enrolled(sb *sandboxv1.Sandbox) bool {
	return !pooled(sb) || sb.Annotations[AnnotationEnrolledPod] != ""
}

// claim reads the SandboxClaim id as a sandbox record (nil, nil if none).
func (b *Backend) claim(ctx context.Context, id string) (*sandboxv1.Sandbox, error) {
	var c extv1.SandboxClaim
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: b.cfg.Namespace, Name: id}, &c); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if !b.pooling() && noClaims(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("kube: get SandboxClaim %s: %w", id, err)
	}
	return claimSandbox(&c), nil
}

// noClaims reports whether err means that this server cannot have claims
// to read: a cluster without agent-sandbox's extensions, or a Role of a
// version before warm pools (the rbac.yaml of a server without --pool).
func noClaims(err error) bool {
	return meta.IsNoMatchError(err) || apierrors.IsNotFound(err) || apierrors.IsForbidden(err)
}

// claims lists airlock's SandboxClaims as sandbox records.
func (b *Backend) claims(ctx context.Context, sel client.MatchingLabels) ([]sandboxv1.Sandbox, error) {
	var l extv1.SandboxClaimList
	if err := b.c.List(ctx, &l, client.InNamespace(b.cfg.Namespace), sel); err != nil {
		if !b.pooling() && noClaims(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("kube: list SandboxClaims: %w", err)
	}
	out := make([]sandboxv1.Sandbox, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, *claimSandbox(&l.Items[i]))
	}
	return out, nil
}

// releaseClaim deletes SandboxClaim id, the Sandbox it was given (if the
// claim controls it: the cluster's garbage collector would too) and the
// sandbox's Secret: the pod goes with its Sandbox, enrolled or not.
func (b *Backend) releaseClaim(ctx context.Context, id string) error {
	b.drop(id)
	var errs []error
	var c extv1.SandboxClaim
	err := b.c.Get(ctx, client.ObjectKey{Namespace: b.cfg.Namespace, Name: id}, &c)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: release SandboxClaim %s: %w", id, err)
	}
	if err == nil {
		name := c.Annotations[extv1.AssignedSandboxNameAnnotation]
		if name == "" {
			name = c.Status.SandboxStatus.Name
		}
		if name != "" {
			var sb sandboxv1.Sandbox
			err := b.c.Get(ctx, client.ObjectKey{Namespace: b.cfg.Namespace, Name: name}, &sb)
			if ref := metav1.GetControllerOf(&sb); err == nil && ref != nil && ref.UID == c.UID {
				if err := b.c.Delete(ctx, &sb, client.Preconditions{UID: &sb.UID}); err != nil && !apierrors.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("kube: delete Sandbox %s of claim %s: %w", name, id, err))
				}
			}
		}
		if err := b.c.Delete(ctx, &c, client.Preconditions{UID: &c.UID}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("kube: delete SandboxClaim %s: %w", id, err))
		}
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: agenttls.SecretName(id), Namespace: b.cfg.Namespace}}
	if err := b.c.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("kube: delete Secret %s: %w", s.Name, err))
	}
	return errors.Join(errs...)
}

// SweepClaims releases airlock's SandboxClaims that were never marked
// enrolled and are older than ReadyTimeout (plus a grace): their creating
// server died between the claim and the enrollment (a live one gives up
// and releases at ReadyTimeout). It returns how many it released. Safe to
// run from every replica.
func (b *Backend) SweepClaims(ctx context.Context) (int, error) {
	items, err := b.claims(ctx, client.MatchingLabels{LabelManagedBy: ManagedBy})
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for i := range items {
		sb := &items[i]
		if enrolled(sb) || !ours(sb) || time.Since(sb.CreationTimestamp.Time) < b.cfg.ReadyTimeout+b.sweepGrace {
			continue
		}
		if err := b.releaseClaim(ctx, sb.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		b.cfg.Logf("kubernetes: released SandboxClaim %s, never enrolled (its server stopped during the create)", sb.Name)
		n++
	}
	return n, errors.Join(errs...)
}

// StartSweeper runs SweepClaims now and then every interval until Close.
func (b *Backend) StartSweeper(interval time.Duration) {
	go func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if _, err := b.SweepClaims(ctx); err != nil {
				b.cfg.Logf("kubernetes: sweep of SandboxClaims: %v", err)
			}
			if b.pooling() {
				if _, err := b.SweepReserved(ctx); err != nil {
					b.cfg.Logf("kubernetes: sweep of reserved SandboxClaims: %v", err)
				}
			}
			cancel()
			select {
			case <-b.stop:
				return
			case <-time.After(interval):
			}
		}
	}()
}

// patchClaim applies a JSON merge patch to SandboxClaim id.
func (b *Backend) patchClaim(ctx context.Context, id string, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	c := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: b.cfg.Namespace}}
	if err := b.c.Patch(ctx, c, client.RawPatch(types.MergePatchType, data)); err != nil {
		if apierrors.IsNotFound(err) {
			return manager.ErrNotFound
		}
		return fmt.Errorf("kube: patch SandboxClaim %s: %w", id, err)
	}
	return nil
}

// pooling reports whether the server serves creates from warm pools: a
// SandboxWarmPool of Config.Pool pods, a reserve of Config.Reserve, or both.
func (b *Backend) pooling() bool { return b.cfg.Pool > 0 || b.cfg.Reserve > 0 }

func cloneMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}
