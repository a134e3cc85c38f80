package manager

import (
	"fmt"

	"airlock/policy"
	"airlock/runtime/gvisor"
)

// checkRuntime refuses an unknown runtime, and gvisor on a host where it
// cannot run (the error says how to install runsc).
func checkRuntime(name string) error {
	r, err := policy.ParseRuntime(name)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	if r == policy.RuntimeGVisor {
		if _, err := gvisor.Available(); err != nil {
			return fmt.Errorf("%w: %w", ErrPolicy, err)
		}
	}
	return nil
}

// checkRuntimePolicy refuses what a runtime cannot enforce yet.
func checkRuntimePolicy(p *policy.Policy, req *CreateRequest) error {
	if p.Runtime != policy.RuntimeGVisor {
		return nil
	}
	if p.Network.Mode != policy.NetNone && req.snap != nil {
		return fmt.Errorf("%w: a gvisor sandbox with network (mode %q) cannot be forked from a snapshot", ErrPolicy, p.Network.Mode)
	}
	if req.Image != "" || len(req.Volumes) > 0 {
		return fmt.Errorf("%w: images and volumes are not available with runtime gvisor yet", ErrPolicy)
	}
	return nil
}

// Runtimes lists the runtimes sandboxes can run under on this server:
// native, wasm (WASI modules run in a native sandbox), and gvisor where
// runsc is installed.
func (m *Manager) Runtimes() []string {
	if m.remote() {
		return m.cfg.Backend.Runtimes()
	}
	out := []string{string(policy.RuntimeNative), string(policy.RuntimeWasm)}
	if _, err := gvisor.Available(); err == nil {
		out = append(out, string(policy.RuntimeGVisor))
	}
	return out
}

// DefaultRuntime is the runtime of sandboxes created without one.
func (m *Manager) DefaultRuntime() string {
	if m.cfg.DefaultRuntime == "" {
		return string(policy.RuntimeNative)
	}
	return string(m.cfg.DefaultRuntime)
}
