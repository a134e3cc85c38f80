package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/internal/spans"
	"github.com/airlock-dev/airlock/kube/agenttls"
	"github.com/airlock-dev/airlock/manager"
)

// The reserve (docs/kubernetes.md, "Warm pools"): a claim on the warm pool
// costs agent-sandbox's controller a bind, an adoption and a pod status
// round trip, and the server an enrollment, before the first exec. With
// Config.Reserve R, each server process keeps up to R sandboxes per pooled
// profile claimed and enrolled ahead of any create: a SandboxClaim named by
// a fresh sandbox id, its Secret, its pod's agent enrolled with that id's
// certificate and dialed by this process. Such a claim has no owner and no
// LabelSandbox, so no API request finds, lists or counts it (ours is
// false); its agent holds a certificate only this process's CA issued and
// no tenant code has run in it. A create the pool can serve takes one:
// one patch, guarded by the claim's resourceVersion and this process's
// token, gives it the owner, labels, policy and shutdown time, and the
// connection already open serves the first exec. The reserve is refilled
// in the background.
//
// A reserved claim's shutdownTime is a lease (Config.ReserveLease): its
// holder renews it while it lives; a holder killed leaves claims that
// agent-sandbox's controller deletes at the lease's end (with their
// Sandbox and pod; the Secret is the claim's), and that any replica's sweep
// releases once the lease is over. Close releases the holder's at once.

// AnnotationReserved marks a reserved SandboxClaim: the token of the
// process holding it. An assigned claim has none.
const AnnotationReserved = "airlock.dev/reserved"

// LabelReserved labels reserved claims (so the sweep lists only them).
const LabelReserved = "airlock.dev/reserved"

// MaxReserve bounds Config.Reserve.
const MaxReserve = 16

// reserved is one sandbox of the reserve: its claim (as marked), its
// enrolled pod and this process's connection to its agent.
type reserved struct {
	mu    sync.Mutex // held while its claim is patched (renewal, assignment)
	id    string
	pool  string
	claim *extv1.SandboxClaim
	pod   types.UID
	conn  *agent.Client
	until time.Time // the lease's end as last written
}

// newSandboxID is a fresh id of the form the manager gives sandboxes.
func newSandboxID() string {
	var b [8]byte
	rand.Read(b[:])
	return "sb-" + hex.EncodeToString(b[:])
}

// ReserveIdle reports how many reserved sandboxes this process holds ready.
func (b *Backend) ReserveIdle() int {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	n := 0
	for _, l := range b.reserve {
		n += len(l)
	}
	return n
}

// ReserveSize is Config.Reserve: how many sandboxes per pooled profile
// this process keeps reserved.
func (b *Backend) ReserveSize() int { return b.cfg.Reserve }

// StartReserve fills the reserve of each pooled profile and keeps it
// filled (and its leases renewed) until Close. Without Config.Reserve it
// does nothing.
func (b *Backend) StartReserve() {
	if b.cfg.Reserve <= 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.stop
		cancel()
	}()
	for _, profile := range b.cfg.PoolProfiles {
		pool := PoolName(profile)
		b.rmu.Lock()
		b.rkick[pool] = make(chan struct{}, 1)
		b.rmu.Unlock()
		b.rwg.Add(1)
		go func() {
			defer b.rwg.Done()
			b.keepReserve(ctx, pool)
		}()
	}
}

// keepReserve is the loop of one pool's reserve.
func (b *Backend) keepReserve(ctx context.Context, pool string) {
	backoff := time.Second
	b.rmu.Lock()
	kick := b.rkick[pool]
	b.rmu.Unlock()
	renew := time.NewTicker(b.cfg.ReserveLease / 4)
	defer renew.Stop()
	for {
		b.renewReserve(ctx, pool)
		for ctx.Err() == nil && b.reserveLen(pool) < b.cfg.Reserve {
			r, err := b.reserveOne(ctx, pool)
			if err != nil {
				if ctx.Err() == nil {
					b.cfg.Logf("kubernetes: reserve of warm pool %s: %v (retrying in %s)", pool, err, backoff)
				}
				break
			}
			backoff = time.Second
			b.rmu.Lock()
			b.reserve[pool] = append(b.reserve[pool], r)
			b.rmu.Unlock()
			// Its lease, which covered the wait for the pod, is the
			// renewed one from now.
			b.renewReserve(ctx, pool)
		}
		wait := b.cfg.ReserveLease / 4
		if b.reserveLen(pool) < b.cfg.Reserve {
			wait, backoff = backoff, min(2*backoff, 30*time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-renew.C:
		case <-time.After(wait):
		}
	}
}

func (b *Backend) reserveLen(pool string) int {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	return len(b.reserve[pool])
}

// reserveOne claims a sandbox of pool for the reserve: a SandboxClaim named
// by a fresh id, without owner or LabelSandbox, leased; its Secret; its
// pod's agent enrolled; a connection to the agent. Any failure releases
// the claim.
func (b *Backend) reserveOne(ctx context.Context, pool string) (*reserved, error) {
	id := newSandboxID()
	ca, err := b.caSecret(ctx)
	if err != nil {
		return nil, err
	}
	enroller, err := b.enroller(ca)
	if err != nil {
		return nil, err
	}
	bundle, err := ca.Issue(id, 0)
	if err != nil {
		return nil, err
	}
	// Until enrolled (and renewed), the lease covers the wait for the pod
	// too.
	until := time.Now().Add(b.cfg.ReadyTimeout + b.cfg.ReserveLease).UTC().Truncate(time.Second)
	claim := &extv1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: b.cfg.Namespace,
			Labels:      map[string]string{LabelManagedBy: ManagedBy, LabelReserved: "true"},
			Annotations: map[string]string{AnnotationPool: pool, AnnotationReserved: b.token}},
		Spec: extv1.SandboxClaimSpec{
			WarmPoolRef: extv1.SandboxWarmPoolRef{Name: pool},
			Lifecycle: &extv1.Lifecycle{ShutdownTime: ptr.To(metav1.NewTime(until)),
				ShutdownPolicy: extv1.ShutdownPolicyDelete},
		},
	}
	if err := b.c.Create(ctx, claim); err != nil {
		return nil, fmt.Errorf("kube: create reserved SandboxClaim %s: %w", id, err)
	}
	release := func(err error) (*reserved, error) {
		if rerr := b.releaseClaim(context.WithoutCancel(ctx), id); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: agenttls.SecretName(id), Namespace: b.cfg.Namespace,
			Labels: map[string]string{LabelManagedBy: ManagedBy},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: extv1.GroupVersion.String(), Kind: "SandboxClaim",
				Name: claim.Name, UID: claim.UID}}},
		Type: corev1.SecretTypeOpaque, Data: bundle.SecretData(), Immutable: ptr.To(true),
	}
	if err := b.c.Create(ctx, secret); err != nil {
		return release(fmt.Errorf("kube: create Secret of reserved %s: %w", id, err))
	}
	wctx, cancel := context.WithTimeout(ctx, b.cfg.ReadyTimeout)
	defer cancel()
	// In the background: polled from 100 ms (the pod usually starts
	// then), sparing the API server.
	pod, err := b.enroll(wctx, claim, enroller, bundle, 100*time.Millisecond, spans.Start())
	if err != nil {
		return release(fmt.Errorf("kube: reserved sandbox %s from warm pool %s: %w", id, pool, err))
	}
	if err := b.markEnrolled(wctx, claim, pod); err != nil {
		return release(fmt.Errorf("kube: mark reserved SandboxClaim %s enrolled: %w", id, err))
	}
	creds, err := bundle.ClientCreds()
	if err != nil {
		return release(err)
	}
	nc, err := agenttls.Dial(wctx, net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(b.port)), creds)
	if err != nil {
		return release(fmt.Errorf("kube: dial reserved sandbox %s: %w", id, err))
	}
	ac, err := agent.NewClient(nc)
	if err != nil {
		nc.Close()
		return release(fmt.Errorf("kube: agent of reserved sandbox %s: %w", id, err))
	}
	return &reserved{id: id, pool: pool, claim: claim, pod: pod.UID, conn: ac, until: until}, nil
}

// renewReserve moves the lease of pool's reserved claims forward; a claim
// gone (deleted by the controller, a sweep, a person) or whose agent
// connection ended leaves the reserve, released.
func (b *Backend) renewReserve(ctx context.Context, pool string) {
	b.rmu.Lock()
	held := append([]*reserved(nil), b.reserve[pool]...)
	b.rmu.Unlock()
	for _, r := range held {
		until := time.Now().Add(b.cfg.ReserveLease).UTC().Truncate(time.Second)
		r.mu.Lock()
		if !b.inReserve(pool, r) {
			// Taken since: its claim is a sandbox's now, whose shutdown
			// time is not the lease's.
			r.mu.Unlock()
			continue
		}
		err := b.patchReserved(ctx, r, map[string]any{"spec": map[string]any{"lifecycle": map[string]any{"shutdownTime": metav1.NewTime(until)}}})
		r.mu.Unlock()
		alive := err == nil
		select {
		case <-r.conn.Done():
			alive = false
		default:
		}
		if alive {
			b.rmu.Lock()
			r.until = until
			b.rmu.Unlock()
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if b.unreserve(pool, r) {
			b.cfg.Logf("kubernetes: reserved sandbox %s left the reserve (%v)", r.id, err)
			b.discard(context.WithoutCancel(ctx), r)
		}
	}
}

// patchReserved merge-patches reserved claim r, guarded by the version
// last read and by this process's token: on a conflict (the claim
// controller writes the claim's status) the claim is read again and the
// patch retried only if the claim is still reserved by this process for
// the same pod.
func (b *Backend) patchReserved(ctx context.Context, r *reserved, patch map[string]any) error {
	for range 5 {
		md, _ := patch["metadata"].(map[string]any)
		if md == nil {
			md = map[string]any{}
		}
		md["resourceVersion"] = r.claim.ResourceVersion
		patch["metadata"] = md
		data, err := json.Marshal(patch)
		if err != nil {
			return err
		}
		err = b.c.Patch(ctx, r.claim, client.RawPatch(types.MergePatchType, data))
		if err == nil || !apierrors.IsConflict(err) {
			return err
		}
		var now extv1.SandboxClaim
		if err := b.c.Get(ctx, client.ObjectKeyFromObject(r.claim), &now); err != nil {
			return err
		}
		if now.Annotations[AnnotationReserved] != b.token || now.Annotations[AnnotationEnrolledPod] != string(r.pod) || !now.DeletionTimestamp.IsZero() {
			return fmt.Errorf("%w: reserved SandboxClaim %s changed hands (reserved by %q, pod %q)", errNotOurs, r.id,
				now.Annotations[AnnotationReserved], now.Annotations[AnnotationEnrolledPod])
		}
		r.claim = &now
	}
	return fmt.Errorf("kube: reserved SandboxClaim %s keeps changing", r.id)
}

// inReserve reports whether r is in pool's reserve.
func (b *Backend) inReserve(pool string, r *reserved) bool {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	return slices.Contains(b.reserve[pool], r)
}

// unreserve removes r from pool's reserve; false if it was not there
// (taken meanwhile).
func (b *Backend) unreserve(pool string, r *reserved) bool {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	l := b.reserve[pool]
	for i, x := range l {
		if x == r {
			b.reserve[pool] = append(l[:i:i], l[i+1:]...)
			return true
		}
	}
	return false
}

// discard closes r's connection and releases its claim.
func (b *Backend) discard(ctx context.Context, r *reserved) {
	r.conn.Close()
	if err := b.releaseClaim(ctx, r.id); err != nil {
		b.cfg.Logf("kubernetes: release reserved sandbox %s: %v", r.id, err)
	}
}

// refillDelay is how long after a take the refill starts: after the
// create's response and its first requests (an exec follows within
// milliseconds), so that the new claim's pod start and enrollment polls do
// not compete with them for the API server and the node's CPU.
const refillDelay = time.Second

// take returns a reserved sandbox of pool whose connection is alive and
// whose lease has time left (nil if none) and wakes the refill
// (refillDelay later).
func (b *Backend) take(pool string) *reserved {
	defer time.AfterFunc(refillDelay, func() {
		b.rmu.Lock()
		kick := b.rkick[pool]
		b.rmu.Unlock()
		select {
		case kick <- struct{}{}:
		default:
		}
	})
	for {
		b.rmu.Lock()
		l := b.reserve[pool]
		if len(l) == 0 {
			b.rmu.Unlock()
			return nil
		}
		r := l[0]
		b.reserve[pool] = l[1:]
		until := r.until
		b.rmu.Unlock()
		select {
		case <-r.conn.Done():
		default:
			if time.Until(until) > b.cfg.ReserveLease/4 {
				return r
			}
		}
		go b.discard(context.Background(), r)
	}
}

// assignReserved makes reserved sandbox r the sandbox of spec: one patch
// of its claim (guarded as patchReserved) sets the owner, labels,
// annotations and shutdown time and removes the reservation; the open
// connection becomes the sandbox's. On failure r is released and the
// caller claims afresh.
func (b *Backend) assignReserved(ctx context.Context, r *reserved, spec manager.RemoteSpec, labels, ann map[string]string) (*sandboxv1.Sandbox, error) {
	lbl := map[string]any{LabelReserved: nil}
	for k, v := range labels {
		lbl[k] = v
	}
	lbl[LabelSandbox] = r.id
	annotations := map[string]any{AnnotationReserved: nil}
	for k, v := range ann {
		annotations[k] = v
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	err := b.patchReserved(ctx, r, map[string]any{
		"metadata": map[string]any{"labels": lbl, "annotations": annotations},
		"spec":     map[string]any{"lifecycle": map[string]any{"shutdownTime": metav1.NewTime(spec.ExpiresAt.UTC().Truncate(time.Second))}},
	})
	if err != nil {
		b.discard(context.WithoutCancel(ctx), r)
		return nil, fmt.Errorf("kube: assign reserved sandbox %s: %w", r.id, err)
	}
	b.mu.Lock()
	if old := b.conns[r.id]; old != nil {
		old.client.Close()
	}
	b.conns[r.id] = &conn{pod: r.pod, client: r.conn, pooled: true}
	b.mu.Unlock()
	return claimSandbox(r.claim), nil
}

// releaseReserve releases every reserved sandbox this process holds (at
// Close).
func (b *Backend) releaseReserve(ctx context.Context) {
	b.rmu.Lock()
	var all []*reserved
	for pool, l := range b.reserve {
		all = append(all, l...)
		delete(b.reserve, pool)
	}
	b.rmu.Unlock()
	for _, r := range all {
		b.discard(ctx, r)
	}
}

// SweepReserved releases reserved SandboxClaims whose lease is over: their
// holder stopped renewing (it was killed; agent-sandbox's controller
// deletes them at that time too, this does not wait for it). It returns
// how many it released. Safe to run from every replica.
func (b *Backend) SweepReserved(ctx context.Context) (int, error) {
	var l extv1.SandboxClaimList
	if err := b.c.List(ctx, &l, client.InNamespace(b.cfg.Namespace),
		client.MatchingLabels{LabelManagedBy: ManagedBy, LabelReserved: "true"}); err != nil {
		if !b.pooling() && noClaims(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("kube: list reserved SandboxClaims: %w", err)
	}
	n := 0
	var errs []error
	for i := range l.Items {
		c := &l.Items[i]
		if c.Annotations[AnnotationReserved] == "" || c.Spec.Lifecycle == nil || c.Spec.Lifecycle.ShutdownTime == nil ||
			time.Now().Before(c.Spec.Lifecycle.ShutdownTime.Time) {
			continue
		}
		if err := b.releaseClaim(ctx, c.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		b.cfg.Logf("kubernetes: released reserved SandboxClaim %s, its lease over (its server stopped)", c.Name)
		n++
	}
	return n, errors.Join(errs...)
}
