package kube

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-dev/airlock/agent"
	alclient "github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/kube/agenttls"
	"github.com/airlock-dev/airlock/manager"
)

// reservedClaims lists the reserved SandboxClaims of the holder token
// ("" for any holder).
func reservedClaims(t *testing.T, token string) []extv1.SandboxClaim {
	t.Helper()
	var l extv1.SandboxClaimList
	if err := admin.List(context.Background(), &l, client.InNamespace(sandboxNS), client.MatchingLabels{LabelReserved: "true"}); err != nil {
		t.Fatal(err)
	}
	var out []extv1.SandboxClaim
	for _, c := range l.Items {
		if token == "" || c.Annotations[AnnotationReserved] == token {
			out = append(out, c)
		}
	}
	return out
}

// pooledPod is a stand-in pooled pod: its agent and its Sandbox.
type pooledPod struct {
	ip string
	pa *podAgent
	sb *sandboxv1.Sandbox
}

// serveReserve plays the claim controller for r's reserve: it waits for
// one of r's reserved claims without a Sandbox, gives it a new pooled pod
// and waits until r holds it ready. It returns the claim's name (the
// sandbox id a create will get) and the pod.
func serveReserve(t *testing.T, r *replica, want int) (string, *pooledPod) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var name string
	for name == "" {
		for _, c := range reservedClaims(t, r.b.token) {
			if c.Annotations[extv1.AssignedSandboxNameAnnotation] == "" {
				name = c.Name
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no reserved claim to bind")
		}
		time.Sleep(50 * time.Millisecond)
	}
	p := &pooledPod{ip: randomLoopback()}
	p.pa = startPooledAgent(t, p.ip)
	p.sb = publishPoolSandbox(t, PoolName(""), p.ip)
	bindClaim(t, name, p.sb)
	for r.b.ReserveIdle() < want {
		if time.Now().After(deadline) {
			t.Fatalf("the reserve holds %d, want %d", r.b.ReserveIdle(), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return name, p
}

// TestWarmPoolReserve: a server with a reserve (--pool-reserve) against
// hostile clients and failures.
//   - a reserved sandbox serves nobody but the server: no key finds, lists,
//     execs in or kills it through any replica, and its agent refuses
//     another sandbox's credentials and the protocol in the clear;
//   - a create the pool can serve gets it (its id, the pod enrolled for it)
//     with the owner's labels and expiry, served to its owner only; the
//     reserve is refilled;
//   - a create the reserved pod cannot serve (custom limits) is applied as
//     an unpooled Sandbox and leaves the reserve alone;
//   - two replicas with reserves hand out different pods;
//   - a replica stopped cleanly releases its reserve; one killed leaves
//     claims that another replica's sweep releases (claim, Secret,
//     Sandbox) once the lease is over, and only then.
func TestWarmPoolReserve(t *testing.T) {
	needEnv(t)
	testserver.NeedRoot(t)
	ctx := context.Background()
	lease := 6 * time.Second
	r := newReplica(t, func(c *Config) { c.Pool = 1; c.Reserve = 1; c.ReserveLease = lease; c.ReadyTimeout = 90 * time.Second })
	if err := r.b.EnsurePools(ctx); err != nil {
		t.Fatal(err)
	}
	r.b.StartReserve()
	idR, podR := serveReserve(t, r, 1)
	if got, size := r.m.PoolIdle(), r.m.PoolReserve(); got != 1 || size != 1 {
		t.Errorf("pool_idle, pool_reserve of /v1/info with a full reserve: %d, %d", got, size)
	}

	// Reserved: nobody's, through any replica.
	r2 := newReplica(t, nil)
	for _, rr := range []*replica{r, r2} {
		for _, owner := range []string{"key-rs-a", ""} {
			if _, err := rr.m.Lookup(owner, idR); !errors.Is(err, manager.ErrNotFound) {
				t.Errorf("lookup of a reserved sandbox by %q: %v", owner, err)
			}
			if err := rr.m.Kill(ctx, owner, idR); !errors.Is(err, manager.ErrNotFound) {
				t.Errorf("kill of a reserved sandbox by %q: %v", owner, err)
			}
			if l, err := rr.m.List(ctx, owner, manager.ListOptions{}); err != nil || len(l) != 0 {
				t.Errorf("list by %q with a reserved sandbox: %+v %v", owner, l, err)
			}
		}
	}
	other, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-rs-b", Limits: manager.Limits{MemoryBytes: 300 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.m.Kill(ctx, "key-rs-b", other.ID)
	if other.ID == idR {
		t.Fatal("an unpooled create (custom limits) got the reserved sandbox")
	}
	if r.b.ReserveIdle() != 1 {
		t.Error("an unpooled create took from the reserve")
	}
	var otherSec corev1.Secret
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: agenttls.SecretName(other.ID)}, &otherSec); err != nil {
		t.Fatal(err)
	}
	otherCreds, err := agenttls.NewClientCreds(other.ID, otherSec.Data)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(podR.ip, strconv.Itoa(AgentPort))
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if c, err := agenttls.Dial(dctx, addr, otherCreds); err == nil {
		c.Close()
		t.Error("another sandbox's credentials reached the reserved agent")
	}
	cancel()
	if raw, err := net.DialTimeout("tcp", addr, 10*time.Second); err == nil {
		raw.SetDeadline(time.Now().Add(30 * time.Second))
		if ac, err := agent.NewClient(raw); err == nil {
			ac.Close()
			t.Error("the reserved agent served the protocol in the clear")
		}
		raw.Close()
	}

	// A pooled create takes it.
	in, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-rs-a", Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if in.ID != idR {
		t.Fatalf("pooled create got %s, not the reserved %s", in.ID, idR)
	}
	var claim extv1.SandboxClaim
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: idR}, &claim); err != nil {
		t.Fatal(err)
	}
	if claim.Annotations[AnnotationReserved] != "" || claim.Labels[LabelReserved] != "" || claim.Annotations[AnnotationOwner] != "key-rs-a" ||
		claim.Labels[LabelSandbox] != idR || claim.Labels[LabelOwner] != OwnerLabel("key-rs-a") {
		t.Errorf("assigned claim: labels %v annotations %v", claim.Labels, claim.Annotations)
	}
	if st := claim.Spec.Lifecycle.ShutdownTime; st == nil || in.ExpiresAt == nil || st.Time.Sub(*in.ExpiresAt).Abs() > time.Second ||
		time.Until(st.Time) < 10*lease {
		t.Errorf("assigned claim's shutdown time %v, sandbox expires at %v (the lease is %s)", st, in.ExpiresAt, lease)
	}
	sbA, err := r.m.Lookup("key-rs-a", idR)
	if err != nil {
		t.Fatal(err)
	}
	if got := execOut(t, sbA.Agent(), podR.pa.work, "echo mine > f; cat f"); got != "mine\n" {
		t.Errorf("exec in the assigned sandbox: %q", got)
	}
	sbA2, err := r2.m.Lookup("key-rs-a", idR)
	if err != nil {
		t.Fatalf("lookup of the assigned sandbox through another replica: %v", err)
	}
	if got := execOut(t, sbA2.Agent(), podR.pa.work, "cat f"); got != "mine\n" {
		t.Errorf("second replica reads %q", got)
	}
	for _, rr := range []*replica{r, r2} {
		if _, err := rr.m.Lookup("key-rs-b", idR); !errors.Is(err, manager.ErrNotFound) {
			t.Errorf("another key's lookup of the assigned sandbox: %v", err)
		}
		if err := rr.m.Kill(ctx, "key-rs-b", idR); !errors.Is(err, manager.ErrNotFound) {
			t.Errorf("another key's kill of the assigned sandbox: %v", err)
		}
	}
	if l, err := r.m.List(ctx, "key-rs-a", manager.ListOptions{}); err != nil || len(l) != 1 || l[0].ID != idR || l[0].Metadata["k"] != "v" {
		t.Errorf("owner's list: %+v %v", l, err)
	}
	// Refilled: a new reserved claim, served.
	idR2, podR2 := serveReserve(t, r, 1)
	if idR2 == idR {
		t.Fatal("the refill reused the assigned claim")
	}

	// A second replica with a reserve of its own: two creates, one on
	// each, get different pods.
	r3 := newReplica(t, func(c *Config) { c.Pool = 1; c.Reserve = 1; c.ReserveLease = lease; c.ReadyTimeout = 90 * time.Second })
	r3.b.StartReserve()
	idR3, podR3 := serveReserve(t, r3, 1)
	type created struct {
		in  manager.Info
		err error
	}
	res := make(chan created, 2)
	for _, rr := range []*replica{r, r3} {
		go func() {
			in, err := rr.m.Create(ctx, manager.CreateRequest{Owner: "key-rs-c"})
			res <- created{in, err}
		}()
	}
	c1, c2 := <-res, <-res
	if c1.err != nil || c2.err != nil {
		t.Fatalf("creates on two replicas: %v %v", c1.err, c2.err)
	}
	got := map[string]bool{c1.in.ID: true, c2.in.ID: true}
	if !got[idR2] || !got[idR3] {
		t.Fatalf("creates on two replicas got %v, want their reserves %s and %s", got, idR2, idR3)
	}
	pods := map[string]string{}
	for id := range got {
		var c extv1.SandboxClaim
		if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: id}, &c); err != nil {
			t.Fatal(err)
		}
		pods[c.Annotations[AnnotationEnrolledPod]] = id
	}
	if len(pods) != 2 {
		t.Errorf("two creates on two replicas share a pod: %v", pods)
	}
	for id, p := range map[string]*pooledPod{idR2: podR2, idR3: podR3} {
		sb, err := r2.m.Lookup("key-rs-c", id)
		if err != nil {
			t.Fatal(err)
		}
		if got := execOut(t, sb.Agent(), p.pa.work, "echo "+id); got != id+"\n" {
			t.Errorf("exec in %s: %q", id, got)
		}
	}

	// Stopped cleanly: r3's reserve (refilling: its new claim is unbound)
	// is released.
	for len(reservedClaims(t, r3.b.token)) == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	r3.close()
	if n := len(reservedClaims(t, r3.b.token)); n != 0 {
		t.Errorf("a replica stopped cleanly left %d reserved claims", n)
	}

	// Killed: r4 holds a reserved sandbox and stops renewing it without
	// releasing it, as a SIGKILLed server would.
	r4 := newReplica(t, func(c *Config) { c.Pool = 1; c.Reserve = 1; c.ReserveLease = lease; c.ReadyTimeout = 90 * time.Second })
	r4.b.StartReserve()
	id4, pod4 := serveReserve(t, r4, 1)
	r4.b.stopLoops()
	r4.b.rmu.Lock()
	r4.b.reserve = map[string][]*reserved{}
	r4.b.rmu.Unlock()
	// Another replica's sweep before the lease is over keeps it (and r's
	// own, renewed).
	if n, err := r.b.SweepReserved(ctx); err != nil || n != 0 {
		t.Errorf("sweep within the lease released %d: %v", n, err)
	}
	if gone(t, &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: id4}}) {
		t.Fatal("a reserved claim released within its lease")
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !gone(t, &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: id4}}) {
		if time.Now().After(deadline) {
			t.Fatal("the killed replica's reserved claim was never released")
		}
		if _, err := r.b.SweepReserved(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for what, obj := range map[string]client.Object{
		"Secret":  &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: agenttls.SecretName(id4)}},
		"Sandbox": &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: pod4.sb.Name}},
	} {
		if !gone(t, obj) {
			t.Errorf("the killed replica's reserved %s left after the sweep", what)
		}
	}
	// r's reserve (renewed all along) is still there.
	if n := len(reservedClaims(t, r.b.token)); n == 0 {
		t.Error("the sweep released a live replica's reserve")
	}
}

// TestServeReserveKilled: `airlock serve --pool 1 --pool-reserve 1`
// reports its reserve in /v1/info, serves a pooled create from it (the
// reserved id, exec through its API), refills it, and is then killed
// with SIGKILL holding a reserved sandbox: another server's sweep
// releases that claim, its Secret and Sandbox once the lease is over, and
// leaves the assigned sandbox alone (it still serves it).
func TestServeReserveKilled(t *testing.T) {
	needEnv(t)
	testserver.NeedRoot(t)
	kc := writeKubeconfig(t, serverCfg)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a := startServe(t, kc, "--pool", "1", "--pool-reserve", "1", "--pool-reserve-lease", "4s")
	ca := alclient.New(a.url, "")
	// bindNext plays the claim controller for a's next reserved claim and
	// waits until /v1/info reports the reserve full.
	bindNext := func() (string, *pooledPod) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		var name string
		for name == "" {
			for _, c := range reservedClaims(t, "") {
				if c.Annotations[extv1.AssignedSandboxNameAnnotation] == "" {
					name = c.Name
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no reserved claim; log:\n%s", a.logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Cleanup(func() { newReplica(t, nil).b.releaseClaim(context.Background(), name) })
		p := &pooledPod{ip: randomLoopback()}
		p.pa = startPooledAgent(t, p.ip)
		p.sb = publishPoolSandbox(t, PoolName(""), p.ip)
		bindClaim(t, name, p.sb)
		for {
			info, err := ca.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.PoolReserve != 1 {
				t.Fatalf("/v1/info pool_reserve %d, want 1", info.PoolReserve)
			}
			if info.PoolIdle == 1 {
				return name, p
			}
			if time.Now().After(deadline) {
				t.Fatalf("/v1/info pool_idle stays %d; log:\n%s", info.PoolIdle, a.logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	id1, pod1 := bindNext()
	made, err := ca.Create(ctx, alclient.CreateRequest{})
	if err != nil || made.ID != id1 {
		t.Fatalf("pooled create through serve: %+v %v, want the reserved %s", made, err, id1)
	}
	if r, err := ca.Exec(ctx, id1, alclient.ExecRequest{Shell: "echo reserved > f; id -u", Cwd: pod1.pa.work}); err != nil || r.ExitCode != 0 || r.Stdout != "1000\n" {
		t.Fatalf("exec in the reserved sandbox: %+v %v", r, err)
	}
	id2, pod2 := bindNext()
	a.kill()
	claim2 := &extv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: id2}}
	secret2 := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: agenttls.SecretName(id2)}}
	if gone(t, claim2) || gone(t, secret2) {
		t.Fatal("the reserved claim or its Secret was gone before another server swept")
	}
	b := startServe(t, kc, "--pool", "1", "--kube-ready-timeout", "4s")
	deadline := time.Now().Add(2 * time.Minute)
	for !(gone(t, claim2) && gone(t, secret2) && gone(t, &sandboxv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: pod2.sb.Name}})) {
		if time.Now().After(deadline) {
			t.Fatalf("the killed server's reserved claim %s (gone %v), Secret (gone %v) or Sandbox %s left; log:\n%s",
				id2, gone(t, claim2), gone(t, secret2), pod2.sb.Name, b.logs())
		}
		time.Sleep(250 * time.Millisecond)
	}
	if !strings.Contains(b.logs(), "released reserved SandboxClaim "+id2) {
		t.Errorf("the sweeping server did not log the release:\n%s", b.logs())
	}
	cb := alclient.New(b.url, "")
	if r, err := cb.Exec(ctx, id1, alclient.ExecRequest{Shell: "cat f", Cwd: pod1.pa.work}); err != nil || r.Stdout != "reserved\n" {
		t.Errorf("the assigned sandbox after the sweep: %+v %v", r, err)
	}
	if err := cb.Kill(ctx, id1); err != nil {
		t.Fatal(err)
	}
}
