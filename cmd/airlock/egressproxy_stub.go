//go:build !kubernetes

package main

import (
	"fmt"
	"os"
)

func init() { hidden["egress-proxy"] = cmdEgressProxy }

// cmdEgressProxy refuses: this build has no Kubernetes client. The cluster
// egress proxy watches pods with client-go, whose package initialisation
// would otherwise run in every airlock process (the CLI's cold start, each
// sandbox's agent); its image is built with -tags kubernetes instead.
func cmdEgressProxy([]string) int {
	fmt.Fprintln(os.Stderr, "airlock egress-proxy: this airlock was built without Kubernetes support; build it with: CGO_ENABLED=0 go build -tags kubernetes ./cmd/airlock")
	return exitUsage
}
