package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// cpuPeriodUS is the CFS period used for the CPU quota (100 ms).
const cpuPeriodUS = 100000

// minCPUQuotaUS is the smallest quota the kernel accepts (1 ms).
const minCPUQuotaUS = 1000

// Timeouts, variables so that tests can shorten them.
var (
	// killTimeout bounds how long Kill (and so Destroy) waits for the
	// group to become empty.
	killTimeout = 5 * time.Second
	// freezeTimeout bounds how long Kill waits for a group to freeze
	// before signalling it anyway.
	freezeTimeout = 100 * time.Millisecond
	// pauseFreezeTimeout bounds how long Freeze (a pause) waits for the
	// group to freeze. It is longer than Kill's: a task throttled by its
	// CPU quota, or not scheduled on a loaded host, must run to enter
	// the freezer, which can take several quota periods.
	pauseFreezeTimeout = 5 * time.Second
)

// Create makes the group airlock/<name> (name = sandbox id, [a-z0-9-]) with
// the limits: memory limit with swap off (v1: memory.limit_in_bytes and
// memory.memsw.limit_in_bytes if present, swappiness 0; v2: memory.max,
// memory.swap.max=0, memory.oom.group=1), pids.max and a CPU quota over a
// 100 ms period. It fails with an error wrapping ErrControllerMissing if a
// controller needed for a non-zero limit is missing; callers decide whether
// to refuse. It also fails if the group already exists.
func Create(name string, l Limits) (*Group, error) {
	return current().create(name, l)
}

// Lookup returns the existing group name on this host without creating or
// changing it: a restarted supervisor reads the Stats of the groups its
// predecessor created through it.
func Lookup(name string) (*Group, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	h := current()
	if h.info.Version == 0 {
		return nil, fmt.Errorf("cgroups: airlock/%s: no usable cgroups (%s)", name, h.info.Reason)
	}
	return h.group(name), nil
}

func (h *host) create(name string, l Limits) (*Group, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := checkLimits(l); err != nil {
		return nil, err
	}
	if h.info.Version == 0 {
		return nil, fmt.Errorf("cgroups: create airlock/%s: %w: no usable cgroups (%s)", name, ErrControllerMissing, h.info.Reason)
	}
	var missing []string
	if l.MemoryBytes > 0 && !h.info.Has("memory") {
		missing = append(missing, "memory")
	}
	if l.Pids > 0 && !h.info.Has("pids") {
		missing = append(missing, "pids")
	}
	if l.CPUs > 0 && !h.info.Has("cpu") {
		missing = append(missing, "cpu")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("cgroups: create airlock/%s: %w: %s needed for the requested limits, but cgroup v%d under %s offers only [%s] (%s)",
			name, ErrControllerMissing, strings.Join(missing, ","), h.info.Version, h.info.Root, strings.Join(h.info.Controllers, ","), h.info.Reason)
	}
	g := h.group(name)
	for i, d := range g.dirs {
		if err := unix.Mkdir(d, 0o755); err != nil {
			removeDirs(g.dirs[:i], time.Now().Add(killTimeout))
			if err == unix.EEXIST {
				return nil, fmt.Errorf("cgroups: create airlock/%s: group already exists (%s)", name, d)
			}
			return nil, fmt.Errorf("cgroups: create airlock/%s: %w", name, &os.PathError{Op: "mkdir", Path: d, Err: err})
		}
	}
	if err := g.apply(l); err != nil {
		removeDirs(g.dirs, time.Now().Add(killTimeout))
		return nil, fmt.Errorf("cgroups: create airlock/%s: %w", name, err)
	}
	return g, nil
}

// group returns the (possibly not yet created) group name on this host.
func (h *host) group(name string) *Group {
	g := &Group{name: name, version: h.info.Version, controllers: h.info.Controllers,
		oomFromFailcnt: h.oomFromFailcnt, swappinessInherited: h.swappinessInherited}
	if h.info.Version == 2 {
		d := filepath.Join(h.v2, name)
		g.dirs = []string{d}
		has := func(c string) string {
			if h.info.Has(c) {
				return d
			}
			return ""
		}
		g.memDir, g.pidsDir, g.cpuDir, g.acctDir, g.freezerDir = has("memory"), has("pids"), has("cpu"), d, d
		// A split group's processes are in its leaves (SplitV2); a group
		// looked up after a restart may be one.
		g.leaves = []string{d + "/" + AgentLeafName, d + "/" + WorkloadName}
		return g
	}
	dir := func(c string) string {
		if r := h.v1[c]; r != "" {
			d := r + "/" + name
			if !contains(g.dirs, d) {
				g.dirs = append(g.dirs, d)
			}
			return d
		}
		return ""
	}
	g.memDir, g.pidsDir, g.cpuDir, g.acctDir, g.freezerDir = dir("memory"), dir("pids"), dir("cpu"), dir("cpuacct"), dir("freezer")
	return g
}

// apply writes the limits into freshly created directories.
func (g *Group) apply(l Limits) error {
	var quota int64
	if l.CPUs > 0 {
		quota = int64(l.CPUs * cpuPeriodUS)
		if quota < minCPUQuotaUS {
			quota = minCPUQuotaUS
		}
	}
	if g.version == 2 {
		d := g.dirs[0]
		if l.MemoryBytes > 0 {
			if err := writeInt(d+"/memory.max", l.MemoryBytes); err != nil {
				return err
			}
			if err := writeOptional(d+"/memory.swap.max", "0"); err != nil {
				return err
			}
			if err := writeOptional(d+"/memory.oom.group", "1"); err != nil {
				return err
			}
		}
		if l.Pids > 0 {
			if err := writeInt(d+"/pids.max", l.Pids); err != nil {
				return err
			}
		}
		if quota > 0 {
			if err := writeFile(d+"/cpu.max", strconv.FormatInt(quota, 10)+" "+strconv.Itoa(cpuPeriodUS)); err != nil {
				return err
			}
		}
		return nil
	}
	if l.MemoryBytes > 0 {
		// The memory limit must be set before memsw, which may not be
		// lower than it.
		if err := writeInt(g.memDir+"/memory.limit_in_bytes", l.MemoryBytes); err != nil {
			return err
		}
		if err := writeOptional(g.memDir+"/memory.memsw.limit_in_bytes", strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return err
		}
		if !g.swappinessInherited {
			if err := writeOptional(g.memDir+"/memory.swappiness", "0"); err != nil {
				return err
			}
		}
	}
	if l.Pids > 0 {
		if err := writeInt(g.pidsDir+"/pids.max", l.Pids); err != nil {
			return err
		}
	}
	if quota > 0 {
		// A new cgroup's cpu.cfs_period_us is always the kernel default of
		// 100 ms (cpuPeriodUS); only the quota needs writing.
		if err := writeInt(g.cpuDir+"/cpu.cfs_quota_us", quota); err != nil {
			return err
		}
	}
	return nil
}

// writeOptional writes a knob that older kernels or configurations lack
// (swap accounting, memory.oom.group); a missing file is not an error.
func writeOptional(path, data string) error {
	if err := writeFile(path, data); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// Add moves process pid (all its threads) into the group in every
// hierarchy.
func (g *Group) Add(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("cgroups: add pid %d to airlock/%s: invalid pid", pid, g.name)
	}
	s := strconv.Itoa(pid)
	for _, d := range g.dirs {
		var err error
		// A task that is still being forked (TASK_NEW) is refused with
		// EINVAL; it only lasts a moment.
		for try := 0; try < 5; try++ {
			if err = writeFile(d+"/cgroup.procs", s); !errors.Is(err, unix.EINVAL) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("cgroups: add pid %d to airlock/%s: %w", pid, g.name, err)
		}
	}
	return nil
}

// Stats returns the group's accounting now. Counters of controllers the
// host lacks read as zero.
func (g *Group) Stats() (Stats, error) {
	var st Stats
	wrap := func(err error) (Stats, error) {
		return Stats{}, fmt.Errorf("cgroups: stats of airlock/%s: %w", g.name, err)
	}
	if g.version == 2 {
		d := g.dirs[0]
		usec, _, err := readKey(d+"/cpu.stat", "usage_usec")
		if err != nil {
			return wrap(err)
		}
		st.CPUTime = time.Duration(usec) * time.Microsecond
		if g.memDir != "" {
			if st.MemoryBytes, err = readInt(d + "/memory.current"); err != nil {
				return wrap(err)
			}
			if st.PeakMemoryBytes, err = readInt(d + "/memory.peak"); err != nil {
				if !errors.Is(err, unix.ENOENT) { // memory.peak needs Linux 5.19
					return wrap(err)
				}
				st.PeakMemoryBytes = 0
			}
			if st.OOMKills, err = g.oomKills(); err != nil {
				return wrap(err)
			}
		}
		if g.pidsDir != "" {
			if st.Pids, err = readInt(d + "/pids.current"); err != nil {
				return wrap(err)
			}
		}
		return st, nil
	}
	var err error
	if g.acctDir != "" {
		ns, err := readInt(g.acctDir + "/cpuacct.usage")
		if err != nil {
			return wrap(err)
		}
		st.CPUTime = time.Duration(ns)
	}
	if g.memDir != "" {
		if st.MemoryBytes, err = readInt(g.memDir + "/memory.usage_in_bytes"); err != nil {
			return wrap(err)
		}
		if st.PeakMemoryBytes, err = readInt(g.memDir + "/memory.max_usage_in_bytes"); err != nil {
			return wrap(err)
		}
		if st.OOMKills, err = g.oomKills(); err != nil {
			return wrap(err)
		}
	}
	if g.pidsDir != "" {
		if st.Pids, err = readInt(g.pidsDir + "/pids.current"); err != nil {
			return wrap(err)
		}
	}
	return st, nil
}

// OOMKills returns how many processes the kernel's out-of-memory killer has
// killed in the group (with its workload child on v1) so far: the one
// counter of Stats that an exec reads before and after it runs, without
// the others' reads (CPU time, usage, peak, pids). A group without a
// memory controller has none: 0.
func (g *Group) OOMKills() (int64, error) {
	n, err := g.oomKills()
	if err != nil {
		return 0, fmt.Errorf("cgroups: oom kills of airlock/%s: %w", g.name, err)
	}
	return n, nil
}

func (g *Group) oomKills() (int64, error) {
	if g.memDir == "" {
		return 0, nil
	}
	if g.version == 2 {
		n, _, err := readKey(g.dirs[0]+"/memory.events", "oom_kill")
		return n, err
	}
	var n int64
	var err error
	if g.oomFromFailcnt {
		n, err = readInt(g.memDir + "/memory.failcnt")
	} else {
		n, _, err = readKey(g.memDir+"/memory.oom_control", "oom_kill")
	}
	if err != nil {
		return 0, err
	}
	return n + g.workloadOOMKills(), nil
}

// Kill sends SIGKILL to every process in the group and waits (up to 5 s)
// until the group is empty. On v2 it writes cgroup.kill where the kernel
// has it (5.14+). Otherwise, and on v1, it signals each listed process and
// repeats until no process is left; as soon as a process shows up that was
// not there before (a fork racing the kill), later rounds freeze the group
// before listing and thaw it after signalling, so that a fork loop cannot
// outrun it. Killing a destroyed group is a no-op.
func (g *Group) Kill() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.destroyed {
		return nil
	}
	if err := g.kill(time.Now().Add(killTimeout)); err != nil {
		return fmt.Errorf("cgroups: kill airlock/%s: %w", g.name, err)
	}
	return nil
}

// kill is Kill without the lock, giving up at deadline.
func (g *Group) kill(deadline time.Time) error {
	// Signal first and freeze only when needed: on cgroup v1 every
	// freeze/thaw pair flips the kernel's freezer_active static key, which
	// costs milliseconds (see docs/rationale/cgroups.md). A SIGKILLed
	// process can no longer fork, so only processes forked between listing
	// and signalling survive a round; once such a newcomer shows up,
	// something is racing us and later rounds freeze the group first.
	cgroupKill := g.version == 2
	useFreezer := false
	var signalled []int
	wait := 50 * time.Microsecond
	for round := 0; ; round++ {
		pids, err := g.procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes still alive after %v (first: %d)", len(pids), killTimeout, pids[0])
		}
		if cgroupKill {
			// Open pidfds first so that we can sleep until the
			// processes are gone instead of polling.
			fds := openPidfds(pids)
			err := writeFile(g.dirs[0]+"/cgroup.kill", "1")
			if err == nil {
				if !waitPidfds(fds, deadline) {
					backoff(&wait, 5*time.Millisecond)
				}
				continue
			}
			closeAll(fds)
			if !errors.Is(err, unix.ENOENT) {
				return err
			}
			if _, serr := os.Stat(g.dirs[0]); serr != nil {
				return nil // the group itself is gone
			}
			// Kernel before 5.14: use the signal loop below.
			cgroupKill = false
			round = -1
			continue
		}
		if useFreezer && g.freeze(true) {
			// Frozen, nothing can fork any more: list again so that
			// no child created since the first listing is missed.
			if pids, err = g.procs(); err != nil {
				g.freeze(false)
				return err
			}
		}
		var fds []int
		fresh := false
		for _, pid := range pids {
			if containsInt(signalled, pid) {
				continue // SIGKILL already pending, still exiting
			}
			fresh = true
			signalled = append(signalled, pid)
			fd, err := signalPid(pid)
			if err != nil {
				closeAll(fds)
				if useFreezer {
					g.freeze(false)
				}
				return err
			}
			if fd >= 0 {
				fds = append(fds, fd)
			}
		}
		if useFreezer {
			// Thaw even when freezing timed out: a frozen task does
			// not act on its SIGKILL.
			g.freeze(false)
		}
		if fresh && round > 0 {
			useFreezer = g.freezerDir != ""
		}
		if !waitPidfds(fds, deadline) {
			backoff(&wait, 5*time.Millisecond)
		}
	}
}

// pidfdOK is cleared once pidfd_open reports ENOSYS (Linux < 5.3).
var pidfdOK atomic.Bool

func init() { pidfdOK.Store(true) }

// openPidfds opens a pidfd for each live process in pids, skipping those
// that are already gone. It returns nil where pidfds are unsupported.
func openPidfds(pids []int) []int {
	var fds []int
	for _, pid := range pids {
		if !pidfdOK.Load() {
			break
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err == nil {
			fds = append(fds, fd)
		} else if err == unix.ENOSYS {
			pidfdOK.Store(false)
		}
	}
	return fds
}

// signalPid SIGKILLs pid. Where it can, it goes through a pidfd, which it
// returns (-1 otherwise) so that the caller can wait for the exit; a pid
// that is already gone is not an error.
func signalPid(pid int) (int, error) {
	if pidfdOK.Load() {
		fd, err := unix.PidfdOpen(pid, 0)
		switch {
		case err == nil:
			if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && err != unix.ESRCH {
				unix.Close(fd)
				return -1, fmt.Errorf("kill %d: %w", pid, err)
			}
			return fd, nil
		case err == unix.ESRCH:
			return -1, nil
		case err == unix.ENOSYS:
			pidfdOK.Store(false)
		}
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && err != unix.ESRCH {
		return -1, fmt.Errorf("kill %d: %w", pid, err)
	}
	return -1, nil
}

// waitPidfds waits until every process behind fds has exited (a pidfd
// turns readable on exit) or deadline, then closes the fds. It reports
// whether it had anything to wait on. ppoll is used for its nanosecond
// timeout: Go's time.Sleep rounds short sleeps up to about a millisecond,
// while a killed process is usually gone within tens of microseconds.
func waitPidfds(fds []int, deadline time.Time) bool {
	if len(fds) == 0 {
		return false
	}
	defer closeAll(fds)
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	for len(pfds) > 0 {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		ts := unix.NsecToTimespec(left.Nanoseconds())
		n, err := unix.Ppoll(pfds, &ts, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			break
		}
		live := pfds[:0]
		for _, p := range pfds {
			if p.Revents == 0 {
				live = append(live, p)
			}
		}
		pfds = live
	}
	return true
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// procs lists the processes in the group across all its hierarchies.
func (g *Group) procs() ([]int, error) {
	var all []int
	dirs := g.dirs
	if len(g.leaves) > 0 {
		dirs = append(append([]string(nil), g.dirs...), g.leaves...)
	}
	for _, d := range dirs {
		pids, err := readPids(d + "/cgroup.procs")
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		for _, p := range pids {
			if !containsInt(all, p) {
				all = append(all, p)
			}
		}
	}
	return all, nil
}

func containsInt(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// freeze freezes (on) or thaws (off) the group, best effort. Freezing
// reports whether the group reached the frozen state within freezeTimeout.
func (g *Group) freeze(on bool) bool { return g.freezeWithin(on, freezeTimeout) }

// freezeWithin is freeze with its own deadline for reaching the frozen state.
func (g *Group) freezeWithin(on bool, timeout time.Duration) bool {
	if g.freezerDir == "" {
		return false
	}
	var file, state, statusFile, want string
	if g.version == 2 {
		file, statusFile = g.freezerDir+"/cgroup.freeze", g.freezerDir+"/cgroup.events"
		state, want = "0", "frozen 1"
		if on {
			state = "1"
		}
	} else {
		file, statusFile = g.freezerDir+"/freezer.state", g.freezerDir+"/freezer.state"
		state, want = "THAWED", "FROZEN"
		if on {
			state = "FROZEN"
		}
	}
	if err := writeFile(file, state); err != nil || !on {
		return false
	}
	deadline := time.Now().Add(timeout)
	wait := 20 * time.Microsecond
	for {
		var b [256]byte
		data, err := readSmall(statusFile, b[:])
		if err != nil {
			return false
		}
		if strings.Contains(string(data), want) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		backoff(&wait, 2*time.Millisecond)
	}
}

// Destroy kills every process in the group, waits until it is empty (up to
// 5 s) and removes its directories in every hierarchy. It is idempotent.
func (g *Group) Destroy() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.destroyed {
		return nil
	}
	deadline := time.Now().Add(killTimeout)
	killErr := g.kill(deadline)
	if err := removeDirs(g.dirs, deadline); err != nil {
		return fmt.Errorf("cgroups: destroy airlock/%s: %w", g.name, errors.Join(killErr, err))
	}
	g.destroyed = true
	return nil
}

// removeDirs removes the given group directories, retrying until deadline
// while the kernel still reports them busy and removing any child cgroups
// the sandbox may have made. Missing directories are fine.
func removeDirs(dirs []string, deadline time.Time) error {
	var errs []error
	for _, d := range dirs {
		if err := removeCgroup(d, deadline); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroup rmdirs one cgroup directory and, depth first, its
// children.
func removeCgroup(dir string, deadline time.Time) error {
	wait := 20 * time.Microsecond
	for {
		err := unix.Rmdir(dir)
		if err == nil || err == unix.ENOENT {
			return nil
		}
		if err != unix.EBUSY && err != unix.EAGAIN && err != unix.EINTR {
			return &os.PathError{Op: "rmdir", Path: dir, Err: err}
		}
		if ents, rerr := os.ReadDir(dir); rerr == nil {
			for _, e := range ents {
				if e.IsDir() {
					sub := filepath.Join(dir, e.Name())
					killPids(sub + "/cgroup.procs")
					if err := removeCgroup(sub, deadline); err != nil {
						return err
					}
				}
			}
		}
		if time.Now().After(deadline) {
			return &os.PathError{Op: "rmdir", Path: dir, Err: err}
		}
		backoff(&wait, 5*time.Millisecond)
	}
}

// killPids SIGKILLs every process listed in a cgroup.procs file, best
// effort.
func killPids(procsPath string) {
	pids, _ := readPids(procsPath)
	for _, p := range pids {
		unix.Kill(p, unix.SIGKILL)
	}
}

// CleanupStale removes the airlock groups whose name keep rejects, as left
// behind by a crashed launcher: it kills their processes and removes their
// directories. It returns the names removed, sorted.
func CleanupStale(keep func(name string) bool) ([]string, error) {
	return current().cleanupStale(keep)
}

func (h *host) cleanupStale(keep func(name string) bool) ([]string, error) {
	if h.info.Version == 0 {
		return nil, nil
	}
	names, listErr := h.groupNames()
	var removed []string
	errs := []error{listErr}
	for _, n := range names {
		if keep(n) {
			continue
		}
		if err := h.group(n).Destroy(); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, n)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("cgroups: cleanup stale groups: %w", err)
	}
	return removed, nil
}
