package cgroups

// Dirs returns the group's directories, one per cgroup hierarchy it lives
// in (one on cgroup v2), for runtimes that place their own processes in it
// (gVisor's runsc takes the group's path in its OCI spec).
func (g *Group) Dirs() []string { return append([]string(nil), g.dirs...) }

// Version returns the group's cgroup version, 1 or 2.
func (g *Group) Version() int { return g.version }
