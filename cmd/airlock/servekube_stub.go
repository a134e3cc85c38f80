//go:build !kubernetes

package main

import (
	"fmt"

	"github.com/airlock-dev/airlock/manager"
)

// open returns nil for --backend native and refuses kubernetes: this
// build has no Kubernetes client. The backend's libraries (client-go,
// controller-runtime) would add their package initialisation to every
// airlock process, the CLI's cold start and each sandbox's agent; a server
// image is built with -tags kubernetes instead (docs/kubernetes.md).
func (k *kubeFlags) open(logf func(string, ...any), _ int) (manager.Backend, error) {
	switch *k.backend {
	case "native", "":
		if *k.reserve != 0 {
			return nil, fmt.Errorf("--pool-reserve: only with --backend kubernetes")
		}
		return nil, nil
	case "kubernetes":
		return nil, fmt.Errorf("--backend kubernetes: this airlock was built without the Kubernetes backend; build it with: CGO_ENABLED=0 go build -tags kubernetes ./cmd/airlock")
	}
	return nil, fmt.Errorf("--backend %q: want native or kubernetes", *k.backend)
}
