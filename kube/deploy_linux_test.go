package kube

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

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
		objs, err := decodeFile(f)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, u := range objs {
			n++
			if err := admin.Create(ctx, u, client.DryRunAll); err != nil {
				t.Errorf("%s: %s %s: %v", base, u.GetKind(), u.GetName(), err)
			}
		}
	}
	if n < 4 {
		t.Errorf("only %d objects checked", n)
	}
}
