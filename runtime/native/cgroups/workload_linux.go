package cgroups

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// WorkloadName is the child group of a sandbox group that holds the
// workload when the group is split (see Split).
const WorkloadName = "workload"

// Split makes the child group <group>/workload with the workload's memory
// and pids limits, in the memory and pids hierarchies, and raises the
// group's own memory and pids limits by the agent's reserve. The agent
// stays in the group, the workload goes into the child: whatever the
// workload does to its pids and memory, the agent keeps its reserve.
//
// It needs cgroup v1, where one process's threads may sit in different
// groups (the agent forks from one thread left in the child). On v2 it
// returns an error wrapping ErrControllerMissing and changes nothing.
func (g *Group) Split(workload Limits, reservePids, reserveMemory int64) (*Group, error) {
	if g.version != 1 || g.memDir == "" || g.pidsDir == "" {
		return nil, fmt.Errorf("cgroups: split airlock/%s: %w: needs the v1 memory and pids controllers", g.name, ErrControllerMissing)
	}
	c := &Group{name: g.name + "/" + WorkloadName, version: 1, controllers: g.controllers,
		oomFromFailcnt: g.oomFromFailcnt, swappinessInherited: g.swappinessInherited}
	c.memDir, c.pidsDir = g.memDir+"/"+WorkloadName, g.pidsDir+"/"+WorkloadName
	c.dirs = []string{c.memDir}
	if c.pidsDir != c.memDir {
		c.dirs = append(c.dirs, c.pidsDir)
	}
	// The parent's limits are raised first. memsw may never be below the
	// memory limit, so when raising, memsw goes first.
	if workload.MemoryBytes > 0 {
		if err := writeOptional(g.memDir+"/memory.memsw.limit_in_bytes", strconv.FormatInt(workload.MemoryBytes+reserveMemory, 10)); err != nil {
			return nil, fmt.Errorf("cgroups: split airlock/%s: %w", g.name, err)
		}
		if err := writeInt(g.memDir+"/memory.limit_in_bytes", workload.MemoryBytes+reserveMemory); err != nil {
			return nil, fmt.Errorf("cgroups: split airlock/%s: %w", g.name, err)
		}
	}
	if workload.Pids > 0 {
		if err := writeInt(g.pidsDir+"/pids.max", workload.Pids+reservePids); err != nil {
			return nil, fmt.Errorf("cgroups: split airlock/%s: %w", g.name, err)
		}
	}
	for _, d := range c.dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			removeDirs(c.dirs, time.Now().Add(killTimeout))
			return nil, fmt.Errorf("cgroups: split airlock/%s: %w", g.name, err)
		}
	}
	if err := c.apply(Limits{MemoryBytes: workload.MemoryBytes, Pids: workload.Pids}); err != nil {
		removeDirs(c.dirs, time.Now().Add(killTimeout))
		return nil, fmt.Errorf("cgroups: split airlock/%s: %w", g.name, err)
	}
	return c, nil
}

// workloadOOMKills is the OOM-kill count of the group's workload child (v1
// counts OOM kills only in the group where they happen), 0 if there is none.
func (g *Group) workloadOOMKills() int64 {
	if g.version != 1 || strings.HasSuffix(g.name, "/"+WorkloadName) {
		return 0
	}
	d := g.memDir + "/" + WorkloadName
	var n int64
	var err error
	if g.oomFromFailcnt {
		n, err = readInt(d + "/memory.failcnt")
	} else {
		n, _, err = readKey(d+"/memory.oom_control", "oom_kill")
	}
	if err != nil {
		return 0 // no workload child
	}
	return n
}

// AddThreads moves single threads (host tids) into the group's memory and
// pids hierarchies, leaving the rest of their processes where they are.
// Threads that are gone are skipped. v1 only.
func (g *Group) AddThreads(tids []int) error {
	if g.version != 1 {
		return fmt.Errorf("cgroups: add threads to airlock/%s: needs cgroup v1", g.name)
	}
	dirs := []string{g.memDir}
	if g.pidsDir != g.memDir {
		dirs = append(dirs, g.pidsDir)
	}
	for _, tid := range tids {
		for _, d := range dirs {
			if d == "" {
				continue
			}
			err := writeFile(d+"/tasks", strconv.Itoa(tid))
			if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("cgroups: move thread %d to %s: %w", tid, d, err)
			}
		}
	}
	return nil
}
