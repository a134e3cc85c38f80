package native

import (
	"bytes"

	"errors"
	"fmt"
	"github.com/airlock-dev/airlock/policy"
	"os"
	"strconv"
	"strings"
)

// The agent's reserve beyond the workload's limits (Config.Agent): its
// threads (v1) or process (v2) and memory count against the sandbox's
// group, the workload's against a child group (v1) or sibling leaf (v2)
// with the policy's limits.
const (
	AgentReservePids   = 64
	AgentReserveMemory = 64 << 20
)

// ReserveAgent, on cgroup v2, moves the init (the agent) into its leaf
// and turns the limits of the workload's leaf on (cgroups.V2Split.Reserve).
// On cgroup v1 it moves every thread of the init (the agent) but its spawning
// thread into the sandbox's own group, out of the workload's child group.
// spawnerTid is that thread's id inside the sandbox's pid namespace, as the
// agent reports it: workload processes are forked from it and so start in
// the workload's group; threads the Go runtime creates later are cloned
// from the moved ones and stay in the agent's reserve. A no-op without a
// workload group.
func (s *Sandbox) ReserveAgent(spawnerTid int) error {
	if s.split != nil {
		// cgroup v2: the whole agent goes to its leaf; it clones workload
		// processes into theirs.
		return s.split.Reserve(s.Pid)
	}
	if s.workload == nil {
		return nil
	}
	if spawnerTid <= 0 {
		return errors.New("reserve agent: no spawner thread given")
	}
	// Twice: a thread created while the first pass ran is moved by the
	// second. The second looks only at threads the first did not see (each
	// thread's status is read to learn its namespace tid: most of the
	// cost); those it saw are the spawner or already moved.
	seen := map[int]bool{}
	for pass := 0; pass < 2; pass++ {
		tids, found, err := s.threadsExcept(spawnerTid, seen)
		if err != nil {
			return err
		}
		if pass == 0 && !found {
			return fmt.Errorf("reserve agent: thread %d is not a thread of the sandbox's init", spawnerTid)
		}
		if err := s.group.AddThreads(tids); err != nil {
			return fmt.Errorf("reserve agent: %w", err)
		}
	}
	return nil
}

// threadsExcept lists the host tids of the init's threads whose tid in the
// sandbox's pid namespace is not nsTid, and whether nsTid was seen. Threads
// in seen are skipped; every thread looked at is added to seen.
func (s *Sandbox) threadsExcept(nsTid int, seen map[int]bool) ([]int, bool, error) {
	dir := "/proc/" + strconv.Itoa(s.Pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, false, fmt.Errorf("reserve agent: %w", err)
	}
	var tids []int
	found := false
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil || seen[tid] {
			continue
		}
		seen[tid] = true
		b, err := os.ReadFile(dir + "/" + e.Name() + "/status")
		if err != nil {
			continue // exited
		}
		ns := 0
		for _, l := range bytes.Split(b, []byte("\n")) {
			if v, ok := bytes.CutPrefix(l, []byte("NSpid:")); ok {
				f := strings.Fields(string(v))
				ns, _ = strconv.Atoi(f[len(f)-1])
			}
		}
		if ns == nsTid {
			found = true
			continue
		}
		tids = append(tids, tid)
	}
	return tids, found, nil
}

// agentIDs are the host uid and gid the sandbox's agent runs as: AgentUID
// (and its gid, or a root workload's) in a leased range as root; the
// workload's own, the caller's ids, otherwise.
func agentIDs(p policy.Policy, ids idMap) (uid, gid int) {
	uid, gid = p.User.UID, p.User.GID
	if ids.setgroups {
		uid, gid = AgentUID, AgentUID
		if p.User.Root {
			gid = p.User.GID
		}
	}
	return ids.hostUID - p.User.UID + uid, ids.hostGID - p.User.GID + gid
}
