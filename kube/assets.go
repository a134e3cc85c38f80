package kube

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// AssetsVersion is the kube-apiserver version scripts/kube-assets.sh builds
// for the control-plane tests (keep the two in step).
const AssetsVersion = "v1.34.4"

// AssetsCache is where scripts/kube-assets.sh caches its builds, by version
// ($AIRLOCK_KUBE_CACHE overrides it).
const AssetsCache = "/var/cache/airlock/kube"

// AssetsDir returns a directory holding kube-apiserver and etcd for
// controller-runtime's envtest: $KUBEBUILDER_ASSETS if set, else the cache
// of scripts/kube-assets.sh. The error says how to get them.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		cache := os.Getenv("AIRLOCK_KUBE_CACHE")
		if cache == "" {
			cache = AssetsCache
		}
		dir = filepath.Join(cache, AssetsVersion, "bin")
	}
	var missing []string
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%w: %v not in %s: run scripts/setup.sh --tests (or scripts/kube-assets.sh, which builds kube-apiserver %s from the Go module proxy and installs Debian's etcd-server), or set KUBEBUILDER_ASSETS",
			errNoAssets, missing, dir, AssetsVersion)
	}
	return dir, nil
}

var errNoAssets = errors.New("kube: no control plane for the tests")

// HelmVersion is the helm CLI (helm.sh/helm/v4) scripts/helm.sh builds for
// the chart's tests and the real-node e2e (keep the two in step).
const HelmVersion = "v4.3.1"

// HelmPath returns where scripts/helm.sh caches helm HelmVersion:
// $AIRLOCK_KUBE_CACHE (default AssetsCache)/helm/HelmVersion/helm. It may
// not exist yet: scripts/setup.sh --tests builds it in the background.
func HelmPath() string {
	cache := os.Getenv("AIRLOCK_KUBE_CACHE")
	if cache == "" {
		cache = AssetsCache
	}
	return filepath.Join(cache, "helm", HelmVersion, "helm")
}
