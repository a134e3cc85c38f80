package cgroups

import "fmt"

// CPU weights of SetBackground: a background group gets 1/16 of a default
// one's share of contended CPU (v1 cpu.shares, v2 cpu.weight). Not the
// minimum: background work must still finish on a host kept busy by others.
const (
	sharesDefault, sharesBackground = 1024, 64
	weightDefault, weightBackground = 100, 6
)

// SetBackground lowers (on) or restores (off) the group's CPU weight
// against its sibling groups, the other sandboxes. The weight only matters
// when the CPUs are contended: an idle host runs a background group at
// full speed. The CPU quota (Limits.CPUs) is untouched. A group without
// the cpu controller has nothing to change.
func (g *Group) SetBackground(on bool) error {
	if g.cpuDir == "" {
		return nil
	}
	file, v := g.cpuDir+"/cpu.shares", int64(sharesDefault)
	if g.version == 2 {
		file, v = g.cpuDir+"/cpu.weight", weightDefault
		if on {
			v = weightBackground
		}
	} else if on {
		v = sharesBackground
	}
	if err := writeInt(file, v); err != nil {
		return fmt.Errorf("cgroups: cpu weight of airlock/%s: %w", g.name, err)
	}
	return nil
}
