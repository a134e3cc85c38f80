package main

import (
	"context"
	"fmt"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/tier"
	_ "github.com/airlock-dev/airlock/runtime/tiers" // the built-in tiers, for serve and mcp
)

// selectRuntime parses a --runtime value and checks that the tier can run
// here (gvisor needs runsc, installed by scripts/setup.sh).
func selectRuntime(name string) (policy.Runtime, error) {
	r, err := policy.ParseRuntime(name)
	if err != nil {
		return "", err
	}
	t, err := tier.Lookup(r)
	if err != nil {
		return "", err
	}
	if err := t.Available(); err != nil {
		return "", err
	}
	return r, nil
}

// runSandbox runs a one-shot sandbox under the runtime its policy names.
func runSandbox(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error) {
	t, err := tier.Lookup(cfg.Policy.Runtime)
	if err != nil {
		return nil, err
	}
	r, ok := t.(tier.Runner)
	if !ok {
		return nil, fmt.Errorf("runtime %s has no one-shot runs", t.Name())
	}
	return r.Run(ctx, cfg, opts)
}
