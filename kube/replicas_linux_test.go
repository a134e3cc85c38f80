package kube

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-dev/airlock/kube/agenttls"
	"github.com/airlock-dev/airlock/manager"
)

// TestTwoReplicas: two servers (Managers with their own stores and API
// clients) on one API server serve the same sandboxes; when one dies the
// other still has every sandbox and can act on them.
func TestTwoReplicas(t *testing.T) {
	needEnv(t)
	a, b := newReplica(t, nil), newReplica(t, nil)
	ctx := context.Background()
	var ids []string
	for range 2 {
		in, err := a.m.Create(ctx, manager.CreateRequest{Owner: "key-rep"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, in.ID)
	}
	in, err := b.m.Create(ctx, manager.CreateRequest{Owner: "key-rep"})
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, in.ID)
	slices.Sort(ids)
	listIDs := func(r *replica) []string {
		t.Helper()
		l, err := r.m.List(ctx, "key-rep", manager.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, in := range l {
			out = append(out, in.ID)
		}
		return out
	}
	if la, lb := listIDs(a), listIDs(b); !slices.Equal(la, ids) || !slices.Equal(lb, ids) {
		t.Fatalf("lists: a %v, b %v, want %v", la, lb, ids)
	}
	// b pauses a sandbox a created; a sees it paused.
	if _, err := b.m.Pause(ctx, "key-rep", ids[0]); err != nil {
		t.Fatal(err)
	}
	if in, err := a.m.Get(ctx, "key-rep", ids[0]); err != nil || !in.Paused {
		t.Errorf("a's view of b's pause: %+v %v", in, err)
	}
	// Kill replica a (no shutdown of its sandboxes): b has them all.
	a.close()
	if lb := listIDs(b); !slices.Equal(lb, ids) {
		t.Fatalf("after a died, b lists %v, want %v", lb, ids)
	}
	for _, id := range ids {
		if _, err := b.m.SetTimeout(ctx, "key-rep", id, 2*time.Hour); err != nil {
			t.Errorf("b sets the timeout of %s: %v", id, err)
		}
	}
	if _, err := b.m.Resume(ctx, "key-rep", ids[0]); err != nil {
		t.Error(err)
	}
	// A new replica started after a's death serves them too, and the
	// per-key limit counts sandboxes of every replica.
	c := newReplica(t, nil)
	if lc := listIDs(c); !slices.Equal(lc, ids) {
		t.Errorf("new replica lists %v", lc)
	}
	if _, err := c.m.Create(ctx, manager.CreateRequest{Owner: "key-rep", OwnerLimit: 3}); !errors.Is(err, manager.ErrLimit) {
		t.Errorf("a 4th sandbox under a limit of 3 (counted over replicas): %v, want ErrLimit", err)
	}
	for _, id := range ids {
		if err := c.m.Kill(ctx, "key-rep", id); err != nil {
			t.Errorf("kill %s from the new replica: %v", id, err)
		}
	}
	if lb := listIDs(b); len(lb) != 0 {
		t.Errorf("b still lists %v", lb)
	}
}

// TestRBACLeastPrivilege: the backend runs entirely as the ServiceAccount
// of deploy/airlock/rbac.yaml (every test's replicas do), and that account
// can do nothing else: no listing or reading Secrets outside its rules, no
// pod writes, nothing in other namespaces.
func TestRBACLeastPrivilege(t *testing.T) {
	needEnv(t)
	r := newReplica(t, nil)
	ctx := context.Background()
	in, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-rbac"})
	if err != nil {
		t.Fatalf("create as the server's ServiceAccount: %v", err)
	}
	if _, err := r.m.Pause(ctx, "key-rbac", in.ID); err != nil {
		t.Fatalf("pause as the server's ServiceAccount: %v", err)
	}
	c := serverClient(t)
	forbidden := map[string]func() error{
		"list secrets in the sandboxes' namespace": func() error {
			return c.List(ctx, &corev1.SecretList{}, client.InNamespace(sandboxNS))
		},
		"get a secret in another namespace": func() error {
			return c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "x"}, &corev1.Secret{})
		},
		"list secrets cluster-wide": func() error { return c.List(ctx, &corev1.SecretList{}) },
		"delete a pod": func() error {
			return c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: in.ID}})
		},
		"create a pod": func() error {
			return c.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: "p"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}})
		},
		"list pods": func() error { return c.List(ctx, &corev1.PodList{}, client.InNamespace(sandboxNS)) },
		"create a Sandbox in another namespace": func() error {
			return c.Create(ctx, &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sb-00"}})
		},
		"update a Sandbox (only patch)": func() error {
			sb := getSandbox(t, in.ID)
			return c.Update(ctx, sb)
		},
		"delete a SandboxWarmPool": func() error {
			return c.Delete(ctx, &extv1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: "airlock-pool-strict"}})
		},
		"list SandboxTemplates": func() error {
			return c.List(ctx, &extv1.SandboxTemplateList{}, client.InNamespace(sandboxNS))
		},
		"create a SandboxClaim in another namespace": func() error {
			return c.Create(ctx, &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sb-00"},
				Spec: extv1.SandboxClaimSpec{WarmPoolRef: extv1.SandboxWarmPoolRef{Name: "p"}}})
		},
		"delete the server's own namespace": func() error {
			return c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "airlock"}})
		},
	}
	for what, f := range forbidden {
		if err := f(); !apierrors.IsForbidden(err) {
			t.Errorf("%s as the server's ServiceAccount: %v, want forbidden", what, err)
		}
	}
	// What it is granted works (and the same calls by a user with no
	// binding at all are refused, so the grants are what allows them).
	if err := c.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: agenttls.SecretName(in.ID)}, &corev1.Secret{}); err != nil {
		t.Errorf("get the sandbox's secret: %v", err)
	}
	u, err := testEnv.AddUser(envtestUser("system:serviceaccount:airlock:nobody"), nil)
	if err != nil {
		t.Fatal(err)
	}
	nobody, err := NewClient(u.Config())
	if err != nil {
		t.Fatal(err)
	}
	if err := nobody.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: in.ID}, &sandboxv1.Sandbox{}); !apierrors.IsForbidden(err) {
		t.Errorf("an unbound account reads a Sandbox: %v, want forbidden", err)
	}
	if err := r.m.Kill(ctx, "key-rbac", in.ID); err != nil {
		t.Errorf("kill as the server's ServiceAccount: %v", err)
	}
}
