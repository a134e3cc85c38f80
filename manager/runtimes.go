package manager

import (
	"fmt"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// tierOf returns the tier of runtime name ("" is the native tier), refusing
// one that is unknown or cannot run on this host (the error says how to fix
// it).
func tierOf(name policy.Runtime) (tier.Tier, error) {
	t, err := tier.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	if err := t.Available(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	return t, nil
}

// checkRuntime refuses an unknown runtime, and one this host cannot run.
func checkRuntime(name string) error {
	r, err := policy.ParseRuntime(name)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	_, err = tierOf(r)
	return err
}

// refuse is the error for what tier t cannot do (tier.Refuse, as ErrPolicy).
func refuse(t tier.Tier, what, capability string) error {
	return fmt.Errorf("%w: %w", ErrPolicy, tier.Refuse(t, what, capability))
}

// checkRuntimePolicy refuses, from the tier's declared capabilities, what
// the request's runtime cannot do.
func checkRuntimePolicy(p *policy.Policy, req *CreateRequest) error {
	t, err := tierOf(p.Runtime)
	if err != nil {
		return err
	}
	c := t.Caps()
	switch {
	case req.snap != nil && !c.MemorySnapshot:
		return refuse(t, "a fork of a memory snapshot", "memory_snapshot")
	case req.snap != nil && p.Network.Mode != policy.NetNone && !c.ForkWithNetwork:
		return refuse(t, fmt.Sprintf("a fork of a snapshot with network (mode %q)", p.Network.Mode), "fork_with_network")
	case req.Image != "" && !c.ImageRoots:
		return refuse(t, "an image or template root", "image_roots")
	case len(req.Volumes) > 0 && !c.Volumes:
		return refuse(t, "volumes", "volumes")
	case p.Network.Mode != policy.NetNone && !c.Network:
		return refuse(t, fmt.Sprintf("network (mode %q)", p.Network.Mode), "network")
	}
	return nil
}

// Runtimes lists the runtimes sandboxes can run under on this server: the
// registered tiers this host can run.
func (m *Manager) Runtimes() []string {
	if m.remote() {
		return m.cfg.Backend.Runtimes()
	}
	var out []string
	for _, n := range tier.Names() {
		if t, err := tier.Lookup(n); err == nil && t.Available() == nil {
			out = append(out, string(n))
		}
	}
	return out
}

// RuntimeCaps returns each runtime's capabilities on this server (for
// /v1/info): with a Backend, those it declares (BackendCaps), else nil.
func (m *Manager) RuntimeCaps() map[string]tier.Caps {
	if m.remote() {
		if _, ok := m.cfg.Backend.(BackendCaps); !ok {
			return nil
		}
		out := map[string]tier.Caps{}
		for _, n := range m.cfg.Backend.Runtimes() {
			out[n], _ = m.remoteCaps(n)
		}
		return out
	}
	out := map[string]tier.Caps{}
	for _, n := range m.Runtimes() {
		if t, err := tier.Lookup(policy.Runtime(n)); err == nil {
			out[n] = t.Caps()
		}
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
