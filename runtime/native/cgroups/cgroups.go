// Package cgroups gives every native sandbox its own control group with a
// memory limit (swap off), a pids limit and a CPU quota, reads its
// accounting, kills everything in it and removes it again.
//
// It works on cgroup v1 (one hierarchy per controller, possibly co-mounted),
// on pure cgroup v2 (as root under /sys/fs/cgroup/airlock, or as an
// unprivileged user inside the delegated subtree the process runs in) and on
// hybrid hosts, where the version is chosen by where the memory and pids
// controllers actually live.
//
// A group is created and destroyed on every cold sandbox start, so the hot
// path (Create, Add, Destroy) talks to cgroupfs directly with a handful of
// syscalls; host detection runs once and is cached. See
// docs/rationale/cgroups.md.
package cgroups

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
)

// ErrControllerMissing is wrapped by the error Create returns when a limit
// is requested whose controller is not available (or cgroups are unusable
// altogether). Callers decide whether to refuse or to run degraded.
var ErrControllerMissing = errors.New("cgroup controller missing")

// Info describes the host's cgroup setup as detected once.
type Info struct {
	// Version is 1 or 2; 0 if no usable cgroups.
	Version int
	// Controllers lists the usable controllers among memory, pids, cpu
	// (and cpuacct on v1), in that order.
	Controllers []string
	// Root is where airlock creates its groups (v2: a delegated directory;
	// v1: "airlock" under each controller's mount, written as
	// /sys/fs/cgroup/{memory,pids,...}/airlock).
	Root string
	// Reason says why cgroups are unusable or degraded; empty if fine.
	Reason string
	// Delegated is set on cgroup v2 when Root lies in a subtree delegated
	// to the process (systemd's Delegate=yes, as a non-root user) rather
	// than at the top of the hierarchy; Delegation then names that subtree.
	Delegated  bool
	Delegation string
}

// Describe says in one line what the host offers, for airlock doctor:
// "cgroup v2 (memory,pids,cpu) at /sys/fs/cgroup/airlock" or, on a
// delegated subtree, "cgroup v2 (...) in the delegated subtree D, at R".
func (i Info) Describe() string {
	s := describe(i.Version, i.Controllers)
	switch {
	case i.Version == 0:
		return s
	case i.Delegated:
		return fmt.Sprintf("%s in the delegated subtree %s, at %s", s, i.Delegation, i.Root)
	}
	return s + " at " + i.Root
}

// Has reports whether controller c is usable.
func (i Info) Has(c string) bool {
	for _, x := range i.Controllers {
		if x == c {
			return true
		}
	}
	return false
}

// Limits to apply. Zero fields are not applied (callers always set all three
// in practice).
type Limits struct {
	// MemoryBytes caps memory; swap is disabled for the group.
	MemoryBytes int64
	// CPUs is the CPU quota in CPUs (1.5 = 150 ms per 100 ms period).
	CPUs float64
	// Pids caps the number of tasks (processes and threads).
	Pids int64
}

// Stats is a group's accounting at one moment.
type Stats struct {
	// CPUTime is the CPU time consumed by the group (v1 cpuacct.usage,
	// v2 cpu.stat usage_usec).
	CPUTime time.Duration
	// MemoryBytes is the current memory usage.
	MemoryBytes int64
	// PeakMemoryBytes is the highest memory usage seen (v1
	// memory.max_usage_in_bytes, v2 memory.peak; 0 where the kernel has no
	// such file).
	PeakMemoryBytes int64
	// OOMKills counts processes killed by the OOM killer inside the group
	// (v1 memory.oom_control oom_kill, v2 memory.events oom_kill). On v1
	// kernels older than 4.13, which lack oom_kill, it falls back to
	// memory.failcnt, the number of times usage hit the limit; Info.Reason
	// says so when that happens.
	OOMKills int64
	// Pids is the number of tasks now in the group.
	Pids int64
}

// Group is one sandbox's control group, present in every hierarchy airlock
// uses. Its methods are safe for concurrent use.
type Group struct {
	name        string
	version     int
	controllers []string
	// dirs holds every directory of the group, one per distinct hierarchy.
	dirs []string
	// Per-controller directories ("" when the controller is absent). On v2
	// they all equal dirs[0].
	memDir, pidsDir, cpuDir, acctDir, freezerDir string
	// oomFromFailcnt is set on v1 kernels without oom_kill in
	// memory.oom_control.
	oomFromFailcnt bool
	// swappinessInherited: v1 groups inherit memory.swappiness 0 from
	// airlock's root, so Create need not write it.
	swappinessInherited bool

	// leaves are where a split v2 group's processes live (SplitV2): Kill
	// lists them too (missing ones are skipped).
	leaves []string

	mu        sync.Mutex
	destroyed bool
}

// Name returns the group's name (the sandbox id).
func (g *Group) Name() string { return g.name }

// Describe says which cgroup version and controllers the group uses, e.g.
// "cgroup v1 (memory,pids,cpu,cpuacct)".
func (g *Group) Describe() string {
	return describe(g.version, g.controllers)
}

func describe(version int, controllers []string) string {
	if version == 0 {
		return "no cgroups"
	}
	return fmt.Sprintf("cgroup v%d (%s)", version, strings.Join(controllers, ","))
}

// maxNameLen bounds group names well below NAME_MAX.
const maxNameLen = 128

// validName reports whether name is a valid group name: 1 to 128 characters
// from [a-z0-9-].
func validName(name string) bool {
	if name == "" || len(name) > maxNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

func checkName(name string) error {
	if !validName(name) {
		return fmt.Errorf("cgroups: invalid group name %q: want 1-%d characters from [a-z0-9-]", name, maxNameLen)
	}
	return nil
}

func checkLimits(l Limits) error {
	if l.MemoryBytes < 0 || l.Pids < 0 || l.CPUs < 0 || math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0) {
		return fmt.Errorf("cgroups: invalid limits %+v: want finite, non-negative values", l)
	}
	return nil
}
