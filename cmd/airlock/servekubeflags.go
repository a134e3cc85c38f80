package main

import (
	"flag"
	"time"
)

// kubeFlags are serve's flags of the Kubernetes backend (docs/kubernetes.md).
type kubeFlags struct {
	backend      *string
	kubeconfig   *string
	namespace    *string
	agentImage   *string
	defaultImage *string
	classes      *string
	egressProxy  *string
	readyTimeout *time.Duration
	reserve      *int
	reserveLease *time.Duration
}

func (k *kubeFlags) register(fs *flag.FlagSet) {
	k.backend = fs.String("backend", "native", "where sandboxes run: native (this host) or kubernetes (agent-sandbox Sandbox objects of a cluster; docs/kubernetes.md)")
	k.kubeconfig = fs.String("kubeconfig", "", "with --backend kubernetes: kubeconfig file (default: the in-cluster service account)")
	k.namespace = fs.String("namespace", "", "with --backend kubernetes: namespace of the sandboxes (default: the server pod's own)")
	k.agentImage = fs.String("agent-image", "", "with --backend kubernetes: image holding the static airlock binary at /airlock, run as the sandboxes' init container (required)")
	k.defaultImage = fs.String("default-image", "", "with --backend kubernetes: image of sandboxes created without one (required)")
	k.classes = fs.String("runtime-class", "", "with --backend kubernetes: RuntimeClass of each tier, e.g. gvisor=gvisor,microvm=kata (the default; TIER= removes a tier)")
	k.egressProxy = fs.String("kube-egress-proxy", "", "with --backend kubernetes: HOST[:PORT] of the cluster's egress proxy Service (airlock egress-proxy; default port 3128, SOCKS on 1080); the server resolves it, as sandbox pods have no DNS; without it only network mode none is allowed")
	k.reserve = fs.Int("pool-reserve", 0, "with --backend kubernetes: sandboxes of each pooled profile this server keeps claimed from the warm pool and enrolled ahead of creates (0 to 16; a create takes one with one API write: docs/kubernetes.md, \"Warm pools\"); each holds a pod, on top of --pool")
	k.reserveLease = fs.Duration("pool-reserve-lease", 2*time.Minute, "with --pool-reserve: how long a reserved sandbox outlives a server that stops renewing it (killed): its claim's shutdownTime, renewed every quarter of it")
	k.readyTimeout = fs.Duration("kube-ready-timeout", 2*time.Minute, "with --backend kubernetes: how long a create waits for the sandbox's pod and agent")
}

// enabled reports whether --backend kubernetes was given.
func (k *kubeFlags) enabled() bool { return *k.backend == "kubernetes" }
