package cgroups

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// AgentLeafName is the leaf of a split cgroup v2 group that holds the
// agent (see SplitV2); the workload's is WorkloadName.
const AgentLeafName = "agent"

// V2Split is a cgroup v2 sandbox group split into sibling leaves for the
// agent and the workload, made by SplitV2 before the sandbox starts and
// finished by Reserve once the agent runs.
type V2Split struct {
	parent   *Group
	workload Limits
	// Workload is the workload's leaf.
	Workload *Group
	agentDir string
}

// SplitV2 prepares the cgroup v2 split of a fresh, empty group: the
// group's own memory and pids limits are raised by the agent's reserve,
// and two empty sibling leaves are made, <group>/agent and
// <group>/workload. The workload leaf's cgroup.procs and the group's are
// handed to owner:group (the agent's host ids), so that the agent, once
// Reserve has run, may clone processes straight into the workload leaf
// with clone3's CLONE_INTO_CGROUP: the kernel checks write access to the
// target's cgroup.procs and to that of the common ancestor. Controllers
// are not enabled yet: the sandbox's init starts in the group itself,
// whose cgroup namespace must be rooted above both leaves (with
// nsdelegate, CLONE_INTO_CGROUP into a cgroup outside one's namespace is
// refused), and a cgroup with processes cannot enable controllers for its
// children. Reserve does that once the init has its namespace.
//
// It needs cgroup v2 with the memory and pids controllers; elsewhere it
// returns an error wrapping ErrControllerMissing and changes nothing.
func (g *Group) SplitV2(workload Limits, reservePids, reserveMemory int64, owner, group int) (*V2Split, error) {
	if g.version != 2 || g.memDir == "" || g.pidsDir == "" {
		return nil, fmt.Errorf("cgroups: split airlock/%s: %w: needs the cgroup v2 memory and pids controllers", g.name, ErrControllerMissing)
	}
	d := g.dirs[0]
	fail := func(err error) (*V2Split, error) {
		removeDirs([]string{d + "/" + AgentLeafName, d + "/" + WorkloadName}, time.Now().Add(killTimeout))
		return nil, fmt.Errorf("cgroups: split airlock/%s: %w", g.name, err)
	}
	if workload.MemoryBytes > 0 {
		if err := writeInt(d+"/memory.max", workload.MemoryBytes+reserveMemory); err != nil {
			return fail(err)
		}
	}
	if workload.Pids > 0 {
		if err := writeInt(d+"/pids.max", workload.Pids+reservePids); err != nil {
			return fail(err)
		}
	}
	s := &V2Split{parent: g, workload: workload, agentDir: d + "/" + AgentLeafName}
	s.Workload = &Group{name: g.name + "/" + WorkloadName, version: 2, controllers: g.controllers,
		dirs: []string{d + "/" + WorkloadName}}
	w := s.Workload.dirs[0]
	s.Workload.memDir, s.Workload.pidsDir, s.Workload.acctDir, s.Workload.freezerDir = w, w, w, w
	for _, leaf := range []string{s.agentDir, w} {
		if err := os.Mkdir(leaf, 0o755); err != nil {
			return fail(err)
		}
	}
	for _, f := range []string{d + "/cgroup.procs", w + "/cgroup.procs"} {
		if err := os.Chown(f, owner, group); err != nil {
			return fail(err)
		}
	}
	return s, nil
}

// OpenWorkload opens the workload leaf's directory (O_PATH, close-on-exec)
// for clone3's CLONE_INTO_CGROUP.
func (s *V2Split) OpenWorkload() (int, error) {
	fd, err := unix.Open(s.Workload.dirs[0], unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("cgroups: open %s: %w", s.Workload.dirs[0], err)
	}
	return fd, nil
}

// Reserve finishes the split once the sandbox's init (pid, the agent) has
// entered its cgroup namespace in the group: it moves the init into the
// agent leaf, enables memory and pids (and cpu, when the group has it) for
// the group's children, and gives the workload leaf the workload's memory
// limit (swap off; an out-of-memory kill takes the largest process, not the
// whole leaf) and pids limit. From then on the workload cannot take the
// agent's reserve of pids and memory. A failure leaves the group as it
// was, unsplit: the caller fails closed.
func (s *V2Split) Reserve(pid int) error {
	d := s.parent.dirs[0]
	wrap := func(err error) error {
		return fmt.Errorf("cgroups: reserve the agent of airlock/%s: %w", s.parent.name, err)
	}
	if err := writeFile(s.agentDir+"/cgroup.procs", strconv.Itoa(pid)); err != nil {
		return wrap(err)
	}
	// The init is the group's only process: anything else in it now (it
	// forked before the move) would make enabling controllers fail.
	if empty, err := isEmpty(d + "/cgroup.procs"); err != nil || !empty {
		return wrap(errors.Join(err, fmt.Errorf("%s still holds processes after the agent left", d)))
	}
	ctrls := []string{"memory", "pids"}
	if s.parent.cpuDir != "" {
		ctrls = append(ctrls, "cpu")
	}
	for _, c := range ctrls {
		if err := writeFile(d+"/cgroup.subtree_control", "+"+c); err != nil {
			return wrap(err)
		}
	}
	w := s.Workload.dirs[0]
	if s.workload.MemoryBytes > 0 {
		if err := writeInt(w+"/memory.max", s.workload.MemoryBytes); err != nil {
			return wrap(err)
		}
		if err := writeOptional(w+"/memory.swap.max", "0"); err != nil {
			return wrap(err)
		}
	}
	if s.workload.Pids > 0 {
		if err := writeInt(w+"/pids.max", s.workload.Pids); err != nil {
			return wrap(err)
		}
	}
	return nil
}
