package kube

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	sandboxv1alpha1 "sigs.k8s.io/agent-sandbox/api/v1alpha1"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/webhook/conversion"

	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
)

// TestUpgradeFromV021: Sandboxes written by a server of agent-sandbox
// v0.2.1 (its v1alpha1 CRD, kube/testdata/agent-sandbox-v0.2.1, and the
// objects that server made: replicas 1, and replicas 0 for a paused one)
// survive the upgrade to v0.5.6's CRDs (deploy/agent-sandbox/k8s/crds) on a
// kube-apiserver of their own. Reading them as v1beta1 needs agent-sandbox's
// conversion webhook (here its own conversion code, served by
// controller-runtime's handler as its controller serves it): with the
// webhook down the new backend cannot list them, with it up it lists both
// with their owner, policy, expiry and pause state, and MigrateStorage
// rewrites them as v1beta1, after which they are read, resumed and killed
// with the webhook down again.
func TestUpgradeFromV021(t *testing.T) {
	needEnv(t)
	dir, err := AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, add := range []func(*runtime.Scheme) error{sandboxv1alpha1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("testdata", "agent-sandbox-v0.2.1")},
		ErrorIfCRDPathMissing: true, BinaryAssetsDirectory: dir, Scheme: s,
		ControlPlaneStartTimeout: 3 * time.Minute, ControlPlaneStopTimeout: time.Minute,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("a second kube-apiserver for the upgrade: %v", err)
	}
	t.Cleanup(func() { env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const ns = "default"

	// What a v0.2.1 server wrote: a running and a paused Sandbox.
	expires := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	p := policy.Policy{Profile: "default", Network: policy.Network{Mode: policy.NetNone},
		Limits: policy.Limits{MemoryBytes: 256 << 20, CPUs: 1, DiskBytes: 64 << 20}}
	pol, _ := json.Marshal(p)
	oldSandbox := func(id string, replicas int64) {
		t.Helper()
		ps, err := podSpec(podParams{id: id, policy: p, image: "registry.test/python:3", agentImage: "registry.test/airlock:1"})
		if err != nil {
			t.Fatal(err)
		}
		psu, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&ps)
		if err != nil {
			t.Fatal(err)
		}
		labels := map[string]any{LabelSandbox: id, LabelOwner: OwnerLabel("key-old"), LabelManagedBy: ManagedBy}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox",
			"metadata": map[string]any{"name": id, "namespace": ns, "labels": labels,
				"annotations": map[string]any{AnnotationOwner: "key-old", AnnotationPolicy: string(pol),
					AnnotationNetwork: `{"mode":"none"}`, AnnotationMetadata: `{"from":"v0.2.1"}`, AnnotationRuntime: "native"}},
			"spec": map[string]any{
				"podTemplate":    map[string]any{"spec": psu, "metadata": map[string]any{"labels": labels}},
				"shutdownTime":   expires.Format(time.RFC3339),
				"shutdownPolicy": "Delete",
				"replicas":       replicas,
			},
		}}
		if err := c.Create(ctx, u); err != nil {
			t.Fatalf("create the v1alpha1 Sandbox %s: %v", id, err)
		}
	}
	const running, paused = "sb-0000000000000a01", "sb-0000000000000a02"
	oldSandbox(running, 1)
	oldSandbox(paused, 0)

	// The conversion webhook, switchable.
	var up atomic.Bool
	h := conversion.NewWebhookHandler(s, conversion.NewRegistry())
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "webhook down", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	// The upgrade: v0.5.6's Sandbox CRD, its webhook pointed at srv.
	newCRDs, err := decodeFile(filepath.Join("..", "deploy", "agent-sandbox", "k8s", "crds", "agents.x-k8s.io_sandboxes.yaml"))
	if err != nil || len(newCRDs) != 1 {
		t.Fatalf("the v0.5.6 Sandbox CRD: %d objects, %v", len(newCRDs), err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(newCRDs[0].Object, &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Spec.Conversion == nil || crd.Spec.Conversion.Webhook == nil || crd.Spec.Conversion.Webhook.ClientConfig == nil {
		t.Fatalf("the v0.5.6 CRD has no conversion webhook: %+v", crd.Spec.Conversion)
	}
	url := srv.URL + "/convert"
	crd.Spec.Conversion.Webhook.ClientConfig = &apiextensionsv1.WebhookClientConfig{URL: &url, CABundle: caPEM}
	var cur apiextensionsv1.CustomResourceDefinition
	if err := c.Get(ctx, client.ObjectKey{Name: crd.Name}, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec = crd.Spec
	if err := c.Update(ctx, &cur); err != nil {
		t.Fatalf("upgrade the Sandbox CRD: %v", err)
	}

	newBackend := func() *Backend {
		t.Helper()
		nc, err := NewClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(Config{Client: nc, Namespace: ns, AgentImage: "registry.test/airlock:1", DefaultImage: "registry.test/python:3", Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	listIDs := func(b *Backend) ([]manager.Info, error) {
		return b.List(ctx, "key-old", manager.ListOptions{})
	}
	// The API server serves v1beta1 once the CRD is established again.
	b := newBackend()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := listIDs(b)
		if err != nil && !isConversionError(err) && time.Now().Before(deadline) {
			time.Sleep(250 * time.Millisecond)
			b = newBackend() // a fresh REST mapping
			continue
		}
		if err == nil {
			t.Fatal("v1alpha1-stored Sandboxes listed as v1beta1 without the conversion webhook: the test does not exercise conversion")
		}
		t.Logf("webhook down, as expected: %v", err)
		break
	}

	up.Store(true)
	got, err := listIDs(b)
	if err != nil {
		t.Fatalf("list through the webhook: %v", err)
	}
	byID := map[string]manager.Info{}
	for _, in := range got {
		byID[in.ID] = in
	}
	if len(byID) != 2 || byID[running].Paused || !byID[paused].Paused {
		t.Fatalf("after the upgrade: %+v, want %s running and %s paused", got, running, paused)
	}
	if in := byID[running]; in.Metadata["from"] != "v0.2.1" || in.ExpiresAt == nil || !in.ExpiresAt.Equal(expires) || in.Runtime != "native" {
		t.Errorf("converted info %+v", in)
	}
	if pp, err := b.Policy(ctx, "key-old", running); err != nil || pp.Profile != p.Profile {
		t.Errorf("policy of the converted Sandbox: %+v %v", pp, err)
	}
	if _, err := b.Get(ctx, "key-other", running); err == nil {
		t.Error("another key reads the converted Sandbox")
	}

	n, err := b.MigrateStorage(ctx)
	if err != nil || n != 2 {
		t.Fatalf("MigrateStorage: %d, %v; want 2", n, err)
	}
	if n, err := b.MigrateStorage(ctx); err != nil || n != 0 {
		t.Errorf("a second MigrateStorage: %d, %v; want 0 (nothing left)", n, err)
	}

	// Stored as v1beta1 now: no conversion needed.
	up.Store(false)
	b = newBackend()
	got, err = listIDs(b)
	if err != nil || len(got) != 2 {
		t.Fatalf("list after the migration, webhook down: %+v %v", got, err)
	}
	var sb sandboxv1.Sandbox
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: paused}, &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Spec.OperatingMode != sandboxv1.SandboxOperatingModeSuspended || sb.Spec.ShutdownTime == nil ||
		!sb.Spec.ShutdownTime.Time.Equal(expires) || len(sb.Spec.PodTemplate.Spec.InitContainers) != 1 {
		t.Errorf("the migrated paused Sandbox: mode %q, shutdown %v, init containers %d",
			sb.Spec.OperatingMode, sb.Spec.ShutdownTime, len(sb.Spec.PodTemplate.Spec.InitContainers))
	}
	if _, ok := sb.Annotations[v1alpha1StateAnnotation]; ok {
		t.Error("the migrated Sandbox keeps the v1alpha1 state annotation")
	}
	if in, err := b.SetPaused(ctx, "key-old", paused, false); err != nil || in.Paused {
		t.Errorf("resume the migrated Sandbox: %+v %v", in, err)
	}
	if err := b.Kill(ctx, "key-old", running); err != nil {
		t.Errorf("kill the migrated Sandbox: %v", err)
	}
	if got, err := listIDs(b); err != nil || len(got) != 1 || got[0].ID != paused || got[0].Paused {
		t.Errorf("after resume and kill: %+v %v", got, err)
	}
	// The CRD lists both versions as stored until an administrator drops
	// v1alpha1 (docs/kubernetes.md, "Upgrading from agent-sandbox v0.2.1").
	if err := c.Get(ctx, client.ObjectKey{Name: crd.Name}, &cur); err != nil || !slices.Contains(cur.Status.StoredVersions, "v1alpha1") {
		t.Logf("storedVersions %v (%v)", cur.Status.StoredVersions, err)
	}
}

// isConversionError reports whether err is the API server's failure to
// convert through the CRD's webhook (rather than v1beta1 not being served
// yet).
func isConversionError(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "conversion webhook") || strings.Contains(err.Error(), "converting"))
}
