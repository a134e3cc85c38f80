package manager

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/store"
)

// Ceilings returns the server's ceilings on a sandbox's limits.
func (m *Manager) Ceilings() policy.Ceilings { return m.cfg.Ceilings }

// keyLimits returns the per-key maximums of owner (an API key id), or none
// for an empty or unknown owner. A store failure fails the create.
func (m *Manager) keyLimits(ctx context.Context, owner string) (store.KeyLimits, error) {
	if owner == "" {
		return store.KeyLimits{}, nil
	}
	k, err := m.st.GetKey(ctx, owner)
	if errors.Is(err, store.ErrNotFound) {
		return store.KeyLimits{}, nil
	}
	if err != nil {
		return store.KeyLimits{}, fmt.Errorf("manager: read the limits of key %s: %w", owner, err)
	}
	return k.Limits, nil
}

// checkCeilings refuses a create whose limits (the profile's, with the
// request's overrides) or TTL exceed the server's ceilings or the owner
// key's, with ErrInvalid and a message that names the field and the
// ceiling. It runs before a pooled sandbox is handed out too.
func (m *Manager) checkCeilings(ctx context.Context, req *CreateRequest, ttl time.Duration) error {
	p, err := buildPolicy(req)
	if err != nil {
		return err
	}
	if err := m.cfg.Ceilings.Check(p.Limits, "this server"); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	kl, err := m.keyLimits(ctx, req.Owner)
	if err != nil {
		return err
	}
	kc := policy.Ceilings{MemoryBytes: kl.MemoryBytes, CPUs: kl.CPUs, Pids: kl.Pids, DiskBytes: kl.DiskBytes}
	if err := kc.Check(p.Limits, "this API key"); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return checkKeyTimeout(kl, ttl)
}

// checkKeyTimeout refuses a TTL above the key's maximum.
func checkKeyTimeout(kl store.KeyLimits, ttl time.Duration) error {
	if max := time.Duration(kl.TimeoutSeconds) * time.Second; max > 0 && ttl > max {
		return fmt.Errorf("%w: timeout %s is above the ceiling of this API key: %s", ErrInvalid, ttl, max)
	}
	return nil
}

// hostCeilings fills the zero fields of c from the host (HostCeilings); a
// configured ceiling above the host's is refused: a server never promises
// more than the host has.
func hostCeilings(c policy.Ceilings) (policy.Ceilings, error) {
	h, err := policy.HostCeilings()
	if err != nil {
		return c, fmt.Errorf("manager: %w", err)
	}
	var errs []error
	num := func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
	check := func(field string, v, host float64) {
		switch {
		case v < 0:
			errs = append(errs, fmt.Errorf("ceiling %s %s is negative", field, num(v)))
		case v > host:
			errs = append(errs, fmt.Errorf("ceiling %s %s is above this host's %s", field, num(v), num(host)))
		}
	}
	check("memory_bytes", float64(c.MemoryBytes), float64(h.MemoryBytes))
	check("disk_bytes", float64(c.DiskBytes), float64(h.DiskBytes))
	check("pids", float64(c.Pids), float64(h.Pids))
	check("cpus", c.CPUs, h.CPUs)
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("manager: %w", err)
	}
	return h.Min(c), nil
}
