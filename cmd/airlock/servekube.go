package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"airlock/kube"
	"airlock/manager"
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
}

func (k *kubeFlags) register(fs *flag.FlagSet) {
	k.backend = fs.String("backend", "native", "where sandboxes run: native (this host) or kubernetes (agent-sandbox Sandbox objects of a cluster; docs/kubernetes.md)")
	k.kubeconfig = fs.String("kubeconfig", "", "with --backend kubernetes: kubeconfig file (default: the in-cluster service account)")
	k.namespace = fs.String("namespace", "", "with --backend kubernetes: namespace of the sandboxes (default: the server pod's own)")
	k.agentImage = fs.String("agent-image", "", "with --backend kubernetes: image holding the static airlock binary at /airlock, run as the sandboxes' init container (required)")
	k.defaultImage = fs.String("default-image", "", "with --backend kubernetes: image of sandboxes created without one (required)")
	k.classes = fs.String("runtime-class", "", "with --backend kubernetes: RuntimeClass of each tier, e.g. gvisor=gvisor,microvm=kata (the default; TIER= removes a tier)")
	k.egressProxy = fs.String("kube-egress-proxy", "", "with --backend kubernetes: HOST:PORT of the cluster's egress proxy (airlock egress-proxy); without it only network mode none is allowed")
	k.readyTimeout = fs.Duration("kube-ready-timeout", 2*time.Minute, "with --backend kubernetes: how long a create waits for the sandbox's pod and agent")
}

// enabled reports whether --backend kubernetes was given.
func (k *kubeFlags) enabled() bool { return *k.backend == "kubernetes" }

// open returns the Kubernetes backend, nil (as a manager.Backend) for
// --backend native.
func (k *kubeFlags) open(logf func(string, ...any)) (manager.Backend, error) {
	switch *k.backend {
	case "native", "":
		return nil, nil
	case "kubernetes":
	default:
		return nil, fmt.Errorf("--backend %q: want native or kubernetes", *k.backend)
	}
	classes := map[string]string{}
	for tier, name := range kube.DefaultRuntimeClasses {
		classes[tier] = name
	}
	if *k.classes != "" {
		for _, kv := range strings.Split(*k.classes, ",") {
			tier, name, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || tier == "" {
				return nil, fmt.Errorf("--runtime-class %q: want TIER=NAME,...", *k.classes)
			}
			if name == "" {
				delete(classes, tier)
			} else {
				classes[tier] = name
			}
		}
	}
	ns := *k.namespace
	if ns == "" {
		ns = kube.InClusterNamespace()
	}
	if ns == "" {
		return nil, errors.New("--backend kubernetes: no --namespace, and not running in a cluster")
	}
	rc, err := kube.RESTConfig(*k.kubeconfig)
	if err != nil {
		return nil, err
	}
	c, err := kube.NewClient(rc)
	if err != nil {
		return nil, err
	}
	b, err := kube.New(kube.Config{Client: c, Namespace: ns, AgentImage: *k.agentImage, DefaultImage: *k.defaultImage,
		RuntimeClasses: classes, EgressProxy: *k.egressProxy, WaitReady: true, ReadyTimeout: *k.readyTimeout, Logf: logf})
	if err != nil {
		return nil, err
	}
	return b, nil
}
