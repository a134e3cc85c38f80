package cgroups

// PidsLimitHits is how many times a fork or clone in the group failed
// because it was at its pids limit (pids.events "max", v1 and v2), the
// group's workload child included: a fork storm's signature. It returns 0
// when the group has no pids controller.
func (g *Group) PidsLimitHits() (int64, error) {
	if g.pidsDir == "" {
		return 0, nil
	}
	n, _, err := readKey(g.pidsDir+"/pids.events", "max")
	if err != nil {
		return 0, err
	}
	if child, _, err := readKey(g.pidsDir+"/"+WorkloadName+"/pids.events", "max"); err == nil {
		n += child
	}
	return n, nil
}
