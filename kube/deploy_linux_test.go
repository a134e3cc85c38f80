package kube

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestDeployManifests: every object of deploy/airlock (the server
// Deployment and Service, the RuntimeClass, the egress proxy and its
// NetworkPolicies) is accepted by the API server's validation (a dry-run
// create; namespace.yaml and rbac.yaml are applied for real by TestMain),
// and the kustomization lists every file.
func TestDeployManifests(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	files, err := filepath.Glob(filepath.Join("..", "deploy", "airlock", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kust, err := os.ReadFile(filepath.Join("..", "deploy", "airlock", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		base := filepath.Base(f)
		if base == "kustomization.yaml" {
			continue
		}
		if !bytes.Contains(kust, []byte("- "+base)) {
			t.Errorf("kustomization.yaml does not list %s", base)
		}
		if base == "namespace.yaml" || base == "rbac.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); err != nil {
				if !errors.Is(err, io.EOF) {
					t.Errorf("%s: %v", base, err)
				}
				break
			}
			if len(u.Object) == 0 {
				continue
			}
			n++
			if err := admin.Create(ctx, &u, client.DryRunAll); err != nil {
				t.Errorf("%s: %s %s: %v", base, u.GetKind(), u.GetName(), err)
			}
		}
	}
	if n < 4 {
		t.Errorf("only %d objects checked", n)
	}
}
