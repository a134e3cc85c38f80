package manager

import (
	"context"
	"time"

	"github.com/airlock-dev/airlock/runtime/tier"
)

// OOMKills is how many processes the out-of-memory killer has killed in the
// sandbox so far (its cgroups' counters; under a tier whose agent enforces
// the workload's memory limit, gvisor, also the agent's), or -1 if unknown.
func (s *Sandbox) OOMKills() int64 {
	n := s.hostOOMKills()
	if n < 0 || s.client == nil {
		return n
	}
	if t, err := tier.Lookup(s.runtime()); err != nil || !t.Caps().AgentOOM {
		return n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k, err := s.client.OOMKills(ctx)
	if err != nil {
		return -1
	}
	return n + k
}

// hostOOMKills is the sandbox's cgroups' out-of-memory kill counter.
func (s *Sandbox) hostOOMKills() int64 {
	// An exec reads this before every command: read the one counter where
	// the instance can (native), not every counter of Stats.
	if c, ok := s.inst.(tier.OOMCounter); ok {
		n, err := c.OOMKills()
		if err != nil {
			return -1
		}
		return n
	}
	st, err := s.inst.Stats()
	if err != nil {
		return -1
	}
	return st.OOMKills
}

// OOMedSince reports whether the out-of-memory killer has killed a process
// in the sandbox since OOMKills returned before (which must be known).
func (s *Sandbox) OOMedSince(before int64) bool {
	if before < 0 {
		return false
	}
	return s.OOMKills() > before
}
