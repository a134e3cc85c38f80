package kube

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/kube/egressproxy"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
)

// TestEgressSecrets: secrets to inject go into the sandbox's egress Secret
// (labelled for the cluster egress proxy, owned by the Sandbox), never into
// the Sandbox object; the pod mounts only the interception CA and a bundle
// of the server's CAs plus it (never the CA key or the secrets), and its
// trust variables point there. Kill removes the egress Secret.
func TestEgressSecrets(t *testing.T) {
	needEnv(t)
	r := newReplica(t, func(c *Config) { c.EgressProxy = "127.0.0.1" })
	ctx := context.Background()
	const value = "sk-test-5e3c7a"
	in, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-sec",
		Network: policy.Network{Mode: policy.NetAllowlist, Allow: []string{"api.example.com"}},
		Secrets: []egress.Secret{{Host: "api.example.com", Header: "Authorization", Value: "Bearer " + value}}})
	if err != nil {
		t.Fatal(err)
	}
	sb := getSandbox(t, in.ID)
	raw, _ := json.Marshal(sb)
	if strings.Contains(string(raw), value) {
		t.Fatal("the secret's value is in the Sandbox object")
	}
	var es corev1.Secret
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: egressproxy.EgressSecretName(in.ID)}, &es); err != nil {
		t.Fatal(err)
	}
	if es.Labels[egressproxy.LabelPurpose] != egressproxy.PurposeEgress || es.Labels[LabelSandbox] != in.ID ||
		len(es.OwnerReferences) != 1 || es.OwnerReferences[0].UID != sb.UID {
		t.Errorf("egress secret labels %v owners %+v", es.Labels, es.OwnerReferences)
	}
	if !strings.Contains(string(es.Data[egressproxy.SecretsKey]), value) || len(es.Data[egressproxy.CAKeyKey]) == 0 {
		t.Errorf("egress secret keys: %v", slices.Sorted(maps.Keys(es.Data)))
	}
	ca := strings.TrimSpace(string(es.Data[egressproxy.CACertKey]))
	if b := strings.TrimSpace(string(es.Data[EgressBundleKey])); !strings.HasSuffix(b, ca) || strings.Count(b, "BEGIN CERTIFICATE") < 2 {
		t.Errorf("bundle: %d certificates, ends with the CA: %v", strings.Count(b, "BEGIN CERTIFICATE"), strings.HasSuffix(b, ca))
	}
	ps := sb.Spec.PodTemplate.Spec
	var vol *corev1.Volume
	for i := range ps.Volumes {
		if ps.Volumes[i].Name == EgressCAVolume {
			vol = &ps.Volumes[i]
		}
	}
	if vol == nil || vol.Secret == nil || vol.Secret.SecretName != es.Name {
		t.Fatalf("no egress CA volume: %+v", ps.Volumes)
	}
	var keys []string
	for _, it := range vol.Secret.Items {
		keys = append(keys, it.Key)
	}
	if slices.Sort(keys); !slices.Equal(keys, []string{EgressBundleKey, egressproxy.CACertKey}) {
		t.Errorf("the pod mounts keys %v of the egress Secret (never ca.key or secrets.json)", keys)
	}
	env := map[string]string{}
	for _, e := range ps.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["SSL_CERT_FILE"] != "/etc/airlock/ca-bundle.crt" || env["REQUESTS_CA_BUNDLE"] != "/etc/airlock/ca-bundle.crt" ||
		env["CURL_CA_BUNDLE"] != "/etc/airlock/ca-bundle.crt" || env["NODE_EXTRA_CA_CERTS"] != "/etc/airlock/egress-ca.pem" {
		t.Errorf("trust env %v", env)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: in.ID, Namespace: sandboxNS}, Spec: *ps.DeepCopy()}
	if err := admin.Create(ctx, pod, client.DryRunAll); err != nil {
		t.Errorf("the pod with the egress CA is not admitted under restricted: %v", err)
	}
	if err := r.m.Kill(ctx, "key-sec", in.ID); err != nil {
		t.Fatal(err)
	}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: es.Name}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("egress Secret after kill: %v", err)
	}
}
