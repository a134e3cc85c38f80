package manager

import "airlock/runtime/tier"

// OOMKills is how many processes the kernel's out-of-memory killer has
// killed in the sandbox so far (its cgroups' counters), or -1 if unknown.
func (s *Sandbox) OOMKills() int64 {
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
