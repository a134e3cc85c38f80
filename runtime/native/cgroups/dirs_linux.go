package cgroups

import "fmt"

// Dirs returns the group's directories, one per cgroup hierarchy it lives
// in (one on cgroup v2), for runtimes that place their own processes in it
// (gVisor's runsc takes the group's path in its OCI spec).
func (g *Group) Dirs() []string { return append([]string(nil), g.dirs...) }

// Version returns the group's cgroup version, 1 or 2.
func (g *Group) Version() int { return g.version }

// Freeze stops every process of the group where it stands (cgroup
// freezer); their memory stays resident. It returns once the group is
// frozen. A group that does not reach the frozen state in time (a task
// stuck in the kernel) is thawed again and the error says so: it is never
// left half frozen.
func (g *Group) Freeze() error {
	if g.freezerDir == "" {
		return fmt.Errorf("cgroups: freeze %s: %w (freezer)", g.name, ErrControllerMissing)
	}
	if !g.freezeWithin(true, pauseFreezeTimeout) {
		if err := g.Thaw(); err != nil {
			return fmt.Errorf("cgroups: freeze %s: the group did not reach the frozen state in %v, and thawing it back failed: %w", g.name, pauseFreezeTimeout, err)
		}
		return fmt.Errorf("cgroups: freeze %s: the group did not reach the frozen state in %v (thawed again)", g.name, pauseFreezeTimeout)
	}
	return nil
}

// Thaw lets the processes of a frozen group run again.
func (g *Group) Thaw() error {
	if g.freezerDir == "" {
		return fmt.Errorf("cgroups: thaw %s: %w (freezer)", g.name, ErrControllerMissing)
	}
	file, state := g.freezerDir+"/freezer.state", "THAWED"
	if g.version == 2 {
		file, state = g.freezerDir+"/cgroup.freeze", "0"
	}
	if err := writeFile(file, state); err != nil {
		return fmt.Errorf("cgroups: thaw %s: %w", g.name, err)
	}
	return nil
}
