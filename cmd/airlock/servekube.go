//go:build kubernetes

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/kube"
	"github.com/airlock-dev/airlock/manager"
)

// open returns the Kubernetes backend, nil (as a manager.Backend) for
// --backend native. pool is --pool: that many pooled pods per pooled
// profile in the cluster's warm pools.
func (k *kubeFlags) open(logf func(string, ...any), pool int) (manager.Backend, error) {
	switch *k.backend {
	case "native", "":
		if *k.reserve != 0 {
			return nil, errors.New("--pool-reserve: only with --backend kubernetes")
		}
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
		RuntimeClasses: classes, EgressProxy: *k.egressProxy, WaitReady: true, ReadyTimeout: *k.readyTimeout, Logf: logf,
		Pool: pool, Reserve: *k.reserve, ReserveLease: *k.reserveLease})
	if err != nil {
		return nil, err
	}
	pctx, pcancel := context.WithTimeout(context.Background(), time.Minute)
	err = b.EnsurePools(pctx)
	pcancel()
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("--pool: %w", err)
	}
	// Claims of a server that died between a claim and its enrollment are
	// released (kube/pool.go), now and then every half ready-timeout (1 s
	// to 1 min).
	b.StartSweeper(min(max(*k.readyTimeout/2, time.Second), time.Minute))
	// Sandboxes claimed and enrolled ahead of creates (--pool-reserve).
	b.StartReserve()
	// Sandboxes of servers built with agent-sandbox v0.2.1 are stored as
	// v1alpha1 and readable only through agent-sandbox's conversion
	// webhook until rewritten. A failure leaves them so (still served).
	mctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	n, err := b.MigrateStorage(mctx)
	cancel()
	if n > 0 || err != nil {
		logf("kubernetes: %d Sandboxes of agent-sandbox v1alpha1 rewritten as v1beta1 (err: %v)", n, err)
	}
	return b, nil
}
