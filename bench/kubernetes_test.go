package bench

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestKubernetesRefusesWithoutCluster: the kubernetes figures refuse, with
// ErrNoCluster and what is missing, when no server and cluster are named,
// when there is no kubectl, and when the cluster does not answer (a local
// HTTP server standing for an airlock server).
func TestKubernetesRefusesWithoutCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := CheckKube(ctx, KubeOptions{}); !errors.Is(err, ErrNoCluster) {
		t.Errorf("no options: %v", err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"runtime_capabilities":{"native":{"pooled":true}}}`))
	}))
	defer srv.Close()
	o := KubeOptions{URL: srv.URL, Namespace: "airlock-sandboxes", Image: "x", Kubectl: "/nonexistent/kubectl"}
	if err := CheckKube(ctx, o); !errors.Is(err, ErrNoCluster) || !strings.Contains(err.Error(), "no kubectl") {
		t.Errorf("no kubectl: %v", err)
	}
	// A kubectl that cannot reach any cluster.
	o.Kubectl = "/bin/false"
	if err := CheckKube(ctx, o); !errors.Is(err, ErrNoCluster) || !strings.Contains(err.Error(), "does not answer") {
		t.Errorf("no cluster: %v", err)
	}
}
