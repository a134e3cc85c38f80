package manager

import "github.com/airlock-dev/airlock/runtime/native/cgroups"

// pidsLimitHits reads a sandbox's pids.events max count (0 if unknown).
func pidsLimitHits(id string) int64 {
	g, err := cgroups.Lookup(id)
	if err != nil {
		return 0
	}
	n, err := g.PidsLimitHits()
	if err != nil {
		return 0
	}
	return n
}
