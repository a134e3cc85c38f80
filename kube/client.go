package kube

import (
	"fmt"
	"os"
	"sync"

	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Scheme returns the types the backend reads and writes: core (pods,
// secrets), node (RuntimeClass) and agent-sandbox's.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, nodev1.AddToScheme,
		sandboxv1.AddToScheme, extv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("kube: scheme: %w", err)
		}
	}
	return s, nil
}

// RESTConfig loads the connection to the API server: from kubeconfig when
// given, else in-cluster (the pod's service account).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kube: kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("kube: no --kubeconfig and not in a cluster: %w", err)
	}
	return cfg, nil
}

// Client-side rate limit of the server's API client, when cfg sets none.
// client-go's default (5 requests/s, bursts of 10) throttled a single
// pooled create: its polls for the claim's pod and the reserve's
// background refill spent the bucket, and each further read or write of
// any request waited up to 200 ms for a token (docs/RATIONALE.md).
const (
	clientQPS   = 100
	clientBurst = 200
)

// NewClient returns a controller-runtime client for cfg with Scheme's
// types (uncached: every read asks the API server, the state of record).
func NewClient(cfg *rest.Config) (client.Client, error) {
	if cfg.QPS == 0 && cfg.Burst == 0 && cfg.RateLimiter == nil {
		cfg = rest.CopyConfig(cfg)
		cfg.QPS, cfg.Burst = clientQPS, clientBurst
	}
	// controller-runtime logs through a global logger and, when none is
	// set, prints a warning with a stack trace to stderr after 30 s.
	quietOnce.Do(func() { ctrllog.SetLogger(logr.Discard()) })
	s, err := Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("kube: client for %s: %w", cfg.Host, err)
	}
	return c, nil
}

var quietOnce sync.Once

// InClusterNamespace returns the namespace of the pod this process runs in
// ("" outside a cluster).
func InClusterNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return string(b)
}
