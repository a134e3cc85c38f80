package manager

import (
	"fmt"

	"airlock/runtime/native/cgroups"
)

// freeze freezes (on) or thaws the sandbox's cgroup, named after its id
// for both runtimes.
func freeze(id string, on bool) error {
	g, err := cgroups.Lookup(id)
	if err != nil {
		return fmt.Errorf("manager: pause needs the sandbox's cgroup: %w", err)
	}
	if on {
		return g.Freeze()
	}
	return g.Thaw()
}
