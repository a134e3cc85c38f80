package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoKubernetesClientInDefaultBuild: the default build links no
// Kubernetes client library. Their package initialisation (client-go's
// scheme registration, ~10 ms of CPU and 40 MB of binary here) would run
// in every airlock process: `airlock run`'s cold start and each sandbox's
// agent. The commands that need one are built with -tags kubernetes.
func TestNoKubernetesClientInDefaultBuild(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/airlock-dev/airlock/cmd/airlock").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var bad []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "k8s.io/") || strings.HasPrefix(p, "sigs.k8s.io/") {
			bad = append(bad, p)
		}
	}
	if len(bad) > 0 {
		t.Fatalf("the default build of cmd/airlock links %d Kubernetes packages (e.g. %s); keep them behind the kubernetes build tag", len(bad), bad[0])
	}
	out, err = exec.Command("go", "list", "-tags", "kubernetes", "-deps", "github.com/airlock-dev/airlock/cmd/airlock").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "k8s.io/client-go/") {
		t.Fatalf("-tags kubernetes build links no client-go (%v): the tagged commands are gone", err)
	}
}
