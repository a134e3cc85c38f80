package native

import "errors"

// OOMKills returns how many of the sandbox's processes the kernel's
// out-of-memory killer has killed so far: Stats().OOMKills, reading only
// that counter (an exec through the API reads it before every command).
func (s *Sandbox) OOMKills() (int64, error) {
	if s.group == nil {
		return 0, errors.New("no cgroup: accounting unavailable")
	}
	return s.group.OOMKills()
}
