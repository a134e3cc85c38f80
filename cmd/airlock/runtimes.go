package main

import (
	"context"

	"airlock/policy"
	"airlock/runtime/gvisor"
	"airlock/runtime/native"
	"airlock/runtime/tier"
	_ "airlock/runtime/tiers" // the built-in tiers, for serve and mcp
	"airlock/runtime/wasm"
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
	switch cfg.Policy.Runtime {
	case policy.RuntimeGVisor:
		return gvisor.Run(ctx, cfg, opts)
	case policy.RuntimeWasm:
		return wasm.Run(ctx, cfg, opts)
	}
	return native.Run(ctx, cfg, opts)
}
