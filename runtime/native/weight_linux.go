package native

import "errors"

// SetBackground lowers (on) or restores (off) the sandbox's CPU weight
// against the other sandboxes (cgroups.Group.SetBackground): a warm pool
// warms its sandboxes with the CPU that sandboxes in use leave over.
func (s *Sandbox) SetBackground(on bool) error {
	if s.group == nil {
		return errors.New("no cgroup: no CPU weight to set")
	}
	return s.group.SetBackground(on)
}
