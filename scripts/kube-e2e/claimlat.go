// kube-e2e claimlat: how long agent-sandbox's controller takes to hand a
// SandboxClaim a warm Sandbox, without airlock (the floor under a pooled
// create's latency).

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-dev/airlock/kube"
)

// cmdClaimLat is "kube-e2e claimlat -kubeconfig F -namespace NS -pool P
// -n N": N SandboxClaims on the warm pool P, each made once the pool is
// full, timed from the create until the claim names its Sandbox (bound)
// and until that Sandbox is the claim's with its pod Running (adopted:
// what a pooled create waits for before it enrolls the agent), polled
// every 2 ms. Prints p50 and p99 of both.
func cmdClaimLat(args []string) error {
	fs := flag.NewFlagSet("claimlat", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (admin)")
	ns := fs.String("namespace", "airlock-sandboxes", "namespace of the pool")
	pool := fs.String("pool", "airlock-pool-strict", "SandboxWarmPool")
	n := fs.Int("n", 10, "claims")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	c, err := kube.NewClient(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*n)*3*time.Minute)
	defer cancel()
	var bound, adopted []float64
	for i := range *n {
		if err := waitFull(ctx, c, *ns, *pool); err != nil {
			return err
		}
		name := "claimlat-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + "-" + strconv.Itoa(i)
		claim := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: *ns},
			Spec: extv1.SandboxClaimSpec{WarmPoolRef: extv1.SandboxWarmPoolRef{Name: *pool}}}
		t0 := time.Now()
		if err := c.Create(ctx, claim); err != nil {
			return fmt.Errorf("create claim: %w", err)
		}
		b, a, err := waitAdopted(ctx, c, claim, t0)
		c.Delete(context.WithoutCancel(ctx), claim)
		if err != nil {
			return err
		}
		bound, adopted = append(bound, b), append(adopted, a)
		step("claimlat: claim %d/%d bound in %.1f ms, adopted with its pod Running in %.1f ms", i+1, *n, b, a)
	}
	slices.Sort(bound)
	slices.Sort(adopted)
	fmt.Printf("claimlat over %d claims (agent-sandbox's controller, no airlock): bound p50 %.1f ms p99 %.1f ms; adopted p50 %.1f ms p99 %.1f ms\n",
		*n, pct(bound, 50), pct(bound, 99), pct(adopted, 50), pct(adopted, 99))
	return nil
}

// pct is the nearest-rank percentile of sorted s.
func pct(s []float64, p float64) float64 {
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

func waitFull(ctx context.Context, c client.Client, ns, pool string) error {
	for {
		var p extv1.SandboxWarmPool
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: pool}, &p); err != nil {
			return fmt.Errorf("warm pool %s: %w", pool, err)
		}
		if p.Spec.Replicas != nil && *p.Spec.Replicas > 0 && p.Status.ReadyReplicas == *p.Spec.Replicas {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("warm pool %s not full: %w", pool, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func waitAdopted(ctx context.Context, c client.Client, claim *extv1.SandboxClaim, t0 time.Time) (bound, adopted float64, err error) {
	ms := func() float64 { return float64(time.Since(t0).Microseconds()) / 1000 }
	for {
		if err := c.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
			return 0, 0, err
		}
		if name := claim.Annotations[extv1.AssignedSandboxNameAnnotation]; name != "" {
			if bound == 0 {
				bound = ms()
			}
			var sb sandboxv1.Sandbox
			var pod corev1.Pod
			if c.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: name}, &sb) == nil {
				if ref := metav1.GetControllerOf(&sb); ref != nil && ref.UID == claim.UID &&
					c.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: name}, &pod) == nil &&
					pod.Status.Phase == corev1.PodRunning {
					return bound, ms(), nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return 0, 0, errors.New("claim " + claim.Name + " not adopted")
		case <-time.After(2 * time.Millisecond):
		}
	}
}
