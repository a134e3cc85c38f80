package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// KubeKey is the `airlock bench --only` key of the Kubernetes figures. It
// is not in Keys (not part of a default run): it needs a real cluster with
// agent-sandbox's controller and an `airlock serve --backend kubernetes
// --pool N` on it, which scripts/kubernetes-e2e.sh provides.
const KubeKey = "kubernetes"

// KubeOptions configures the Kubernetes figures.
type KubeOptions struct {
	// URL and Key reach an `airlock serve --backend kubernetes --pool N`.
	URL, Key string
	// Kubectl is the kubectl binary ("" means kubectl on PATH) and
	// Kubeconfig its configuration ("" means kubectl's default).
	Kubectl, Kubeconfig string
	// Namespace is the sandboxes' namespace (where the warm pool is).
	Namespace string
	// Pool is the SandboxWarmPool of the default profile
	// (kube.PoolName(""), "airlock-pool-strict").
	Pool string
	// RunNamespace is where `kubectl run` starts its pods (a namespace
	// without the sandboxes' restricted Pod Security level).
	RunNamespace string
	// Image is the image `kubectl run` starts: the server's default image.
	Image string
	// Claims is the number of pooled claims measured (50 if zero).
	Claims int
	// Runs is the number of unpooled creates and kubectl runs (10 if
	// zero).
	Runs int
	// PooledOnly skips the unpooled creates and kubectl runs.
	PooledOnly bool
	// Timeout bounds each round (2 minutes if zero).
	Timeout time.Duration
	// Progress, if set, is told what runs.
	Progress func(format string, args ...any)
}

// ErrNoCluster is why the Kubernetes figures refuse to run.
var ErrNoCluster = errors.New("`airlock bench --only kubernetes` needs a real cluster (agent-sandbox's controller, nodes that run pods) and `airlock serve --backend kubernetes --pool N` on it: give --kube-url, --kube-key, --kubeconfig, --kube-namespace and --kube-image (scripts/kubernetes-e2e.sh runs it so)")

func (o *KubeOptions) defaults() {
	if o.Kubectl == "" {
		o.Kubectl = "kubectl"
	}
	if o.Pool == "" {
		o.Pool = "airlock-pool-strict"
	}
	if o.RunNamespace == "" {
		o.RunNamespace = "default"
	}
	if o.Claims <= 0 {
		o.Claims = 50
	}
	if o.Runs <= 0 {
		o.Runs = 10
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
}

// kubectl runs kubectl with args and returns its trimmed stdout.
func (o *KubeOptions) kubectl(ctx context.Context, args ...string) (string, error) {
	if o.Kubeconfig != "" {
		args = append([]string{"--kubeconfig", o.Kubeconfig}, args...)
	}
	cmd := exec.CommandContext(ctx, o.Kubectl, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// CheckKube returns ErrNoCluster (wrapped with what is missing) unless the
// options name a server and a cluster that answer: the server's backend is
// pooled, the API server is ready and the warm pool exists.
func CheckKube(ctx context.Context, o KubeOptions) error {
	o.defaults()
	if o.URL == "" || o.Namespace == "" || o.Image == "" {
		return ErrNoCluster
	}
	if _, err := exec.LookPath(o.Kubectl); err != nil {
		return fmt.Errorf("%w: no kubectl: %v", ErrNoCluster, err)
	}
	if _, err := o.kubectl(ctx, "get", "--raw", "/readyz"); err != nil {
		return fmt.Errorf("%w: the cluster does not answer: %v", ErrNoCluster, err)
	}
	info, err := client.New(o.URL, o.Key).Info(ctx)
	if err != nil {
		return fmt.Errorf("%w: the airlock server at %s: %v", ErrNoCluster, o.URL, err)
	}
	if c, ok := info.RuntimeCapabilities["native"]; !ok || !c.Pooled {
		return fmt.Errorf("%w: the airlock server at %s has no warm pool (serve --backend kubernetes --pool N or --pool-reserve N)", ErrNoCluster, o.URL)
	}
	if _, err := o.kubectl(ctx, "get", "sandboxwarmpools.extensions.agents.x-k8s.io", o.Pool, "-n", o.Namespace, "-o", "name"); err != nil {
		return fmt.Errorf("%w: no warm pool %s/%s: %v", ErrNoCluster, o.Namespace, o.Pool, err)
	}
	return nil
}

// KubernetesFigures measures, on a real cluster (CheckKube first):
//   - pooled claim to first exec: a create the warm pool serves (a
//     SandboxClaim, its pod's agent enrolled) until `true` has run in it,
//     over Claims claims, each started once the pool is full again (the
//     wait is not timed); Detail has p50 and p99;
//   - create to first exec without a pool (custom limits, so a Sandbox of
//     its own) against `kubectl run` of the same image running `true`
//     until its pod has Succeeded, alternating, Runs rounds each.
//
// Kills and pod deletions are not timed.
func KubernetesFigures(o KubeOptions) []Figure {
	o.defaults()
	c := client.New(o.URL, o.Key)
	pooled := Figure{Name: "kubernetes: pooled claim to first exec", Unit: "ms", Command: []string{"sh", "-c", "true"},
		Note:   fmt.Sprintf("a create served by the warm pool %s (a SandboxClaim: the server's reserve if it keeps one, else claimed and enrolled then) until `true` has run in it; each claim starts with the pool and the reserve full (not timed); kill not timed", o.Pool),
		Rounds: o.Claims}
	note := "airlock serve --backend kubernetes --pool N"
	if info, err := c.Info(context.Background()); err == nil && info.PoolReserve > 0 {
		note += fmt.Sprintf(" --pool-reserve %d", info.PoolReserve)
	}
	res := PeerResult{Peer: Reference, Note: note}
	for i := range o.Claims {
		o.Progress("kubernetes: pooled claim %d/%d", i+1, o.Claims)
		ms, err := o.pooledRound(c)
		res.rounds = append(res.rounds, ms)
		if err != nil {
			res.fail(i, err)
		}
	}
	pooled.Results = []PeerResult{res}
	pooled.summarise()
	if s := pooled.Results[0].Samples; len(s) > 0 {
		pooled.Results[0].Detail = fmt.Sprintf("over %d claims: p50 %.1f ms, p99 %.1f ms (target p99 <= 200 ms on the test node)",
			len(s), Percentile(s, 50), Percentile(s, 99))
	}
	if o.PooledOnly {
		return []Figure{pooled}
	}

	cold := Figure{Name: "kubernetes: create to first exec, no pool", Unit: "ms", Command: []string{"sh", "-c", "true"},
		Note:   "airlock: a create with custom limits (a Sandbox of its own, pod started then) until `true` has run in it; kubectl run: a pod of the same image running `true` until it has Succeeded; alternating",
		Rounds: o.Runs}
	air := PeerResult{Peer: Reference, Note: "airlock serve --backend kubernetes, create with limits.memory_bytes 256 MiB"}
	kr := PeerResult{Peer: "kubectl run", Note: "kubectl run --restart=Never --image-pull-policy=IfNotPresent --image " + o.Image + " -n " + o.RunNamespace}
	for i := range o.Runs {
		o.Progress("kubernetes: unpooled create and kubectl run %d/%d", i+1, o.Runs)
		ms, err := o.unpooledRound(c)
		air.rounds = append(air.rounds, ms)
		if err != nil {
			air.fail(i, err)
		}
		ms, err = o.kubectlRunRound(i)
		kr.rounds = append(kr.rounds, ms)
		if err != nil {
			kr.fail(i, err)
		}
	}
	cold.Results = []PeerResult{air, kr}
	cold.summarise()
	return []Figure{pooled, cold}
}

// nan is a failed round's value.
func nan() float64 { return math.NaN() }

// waitPoolFull waits until the warm pool has as many ready pods as it
// wants.
func (o *KubeOptions) waitPoolFull(ctx context.Context) error {
	var last string
	for {
		out, err := o.kubectl(ctx, "get", "sandboxwarmpools.extensions.agents.x-k8s.io", o.Pool, "-n", o.Namespace,
			"-o", "jsonpath={.spec.replicas} {.status.readyReplicas}")
		if err == nil {
			f := strings.Fields(out)
			// A pool of 0 (a server that only reserves) has no ready count.
			if len(f) == 2 && f[0] == f[1] || len(f) == 1 && f[0] == "0" {
				return nil
			}
			last = out
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the warm pool %s did not refill (replicas, ready: %s): %w", o.Pool, last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitReserveFull waits until the server holds its whole reserve
// (pool_idle reaches pool_reserve in /v1/info; at once without one).
func waitReserveFull(ctx context.Context, c *client.Client) error {
	var last string
	for {
		info, err := c.Info(ctx)
		if err == nil && info.PoolIdle >= info.PoolReserve {
			return nil
		}
		if err == nil {
			last = fmt.Sprintf("%d of %d", info.PoolIdle, info.PoolReserve)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the server's reserve did not refill (%s): %w", last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pooledRound is one pooled claim to first exec, in ms.
func (o *KubeOptions) pooledRound(c *client.Client) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout+5*time.Minute)
	defer cancel()
	if err := o.waitPoolFull(ctx); err != nil {
		return nan(), err
	}
	if err := waitReserveFull(ctx, c); err != nil {
		return nan(), err
	}
	t0 := time.Now()
	sb, err := c.Create(ctx, client.CreateRequest{})
	if err != nil {
		return nan(), fmt.Errorf("create: %w", err)
	}
	defer c.Kill(context.WithoutCancel(ctx), sb.ID)
	r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "true"})
	ms := float64(time.Since(t0).Microseconds()) / 1000
	if err != nil || r.ExitCode != 0 {
		return nan(), fmt.Errorf("exec in %s: %+v %v", sb.ID, r, err)
	}
	// It must have been the pool's: a SandboxClaim named by the id.
	if _, err := o.kubectl(ctx, "get", "sandboxclaims.extensions.agents.x-k8s.io", sb.ID, "-n", o.Namespace, "-o", "name"); err != nil {
		return nan(), fmt.Errorf("sandbox %s was not served by the warm pool: %w", sb.ID, err)
	}
	return ms, nil
}

// unpooledRound is one create without the pool to first exec, in ms.
func (o *KubeOptions) unpooledRound(c *client.Client) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	t0 := time.Now()
	sb, err := c.Create(ctx, client.CreateRequest{Limits: &client.Limits{MemoryBytes: 256 << 20}})
	if err != nil {
		return nan(), fmt.Errorf("create: %w", err)
	}
	defer c.Kill(context.WithoutCancel(ctx), sb.ID)
	r, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "true"})
	ms := float64(time.Since(t0).Microseconds()) / 1000
	if err != nil || r.ExitCode != 0 {
		return nan(), fmt.Errorf("exec in %s: %+v %v", sb.ID, r, err)
	}
	return ms, nil
}

// kubectlRunRound is one `kubectl run` of the image running true until
// its pod Succeeded, in ms.
func (o *KubeOptions) kubectlRunRound(i int) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	name := "airlock-bench-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + "-" + strconv.Itoa(i)
	defer o.kubectl(context.WithoutCancel(ctx), "delete", "pod", name, "-n", o.RunNamespace, "--wait=false", "--grace-period=0")
	t0 := time.Now()
	if _, err := o.kubectl(ctx, "run", name, "-n", o.RunNamespace, "--image", o.Image, "--image-pull-policy=IfNotPresent", "--restart=Never", "--command", "--", "/bin/sh", "-c", "true"); err != nil {
		return nan(), err
	}
	if _, err := o.kubectl(ctx, "wait", "pod/"+name, "-n", o.RunNamespace, "--for=jsonpath={.status.phase}=Succeeded",
		"--timeout="+o.Timeout.String()); err != nil {
		return nan(), err
	}
	return float64(time.Since(t0).Microseconds()) / 1000, nil
}
