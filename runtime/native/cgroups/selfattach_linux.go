package cgroups

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// OpenTasks opens the cgroup v1 "tasks" file of the group in every
// hierarchy, for writing and close-on-exec, so that a freshly cloned,
// still single-threaded child can move itself in by writing "0" to each
// before it runs anything. This is Add for a process that cannot be named
// from outside yet, and it is much cheaper: the kernel moves the writing
// thread without taking the global threadgroup lock, whose first writer
// after a quiet spell waits for an RCU grace period (8-20 ms per sandbox
// start; see docs/RATIONALE.md). The files are opened by the caller, so
// the write is authorized by the opener's credentials, not the child's.
//
// On cgroup v2 there is no per-thread move into a domain cgroup: OpenTasks
// returns ErrControllerMissing and the caller uses Add.
func (g *Group) OpenTasks() ([]int, error) {
	if g.version != 1 {
		return nil, fmt.Errorf("cgroups: tasks files of airlock/%s: %w: cgroup v%d has none", g.name, ErrControllerMissing, g.version)
	}
	fds := make([]int, 0, len(g.dirs))
	for _, d := range g.dirs {
		fd, err := unix.Open(d+"/tasks", unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			for _, f := range fds {
				unix.Close(f)
			}
			return nil, fmt.Errorf("cgroups: open %s/tasks: %w", d, err)
		}
		fds = append(fds, fd)
	}
	return fds, nil
}
