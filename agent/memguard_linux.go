package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// workloadGroup is the workload's cgroup inside gVisor's sentry, which the
// gvisor runtime asks for ("--workload-cgroup=MEMORY:PIDS", with runsc's
// --in-sandbox-cgroup=v2): while still root, the agent mounts gVisor's
// cgroup2 filesystem and makes one group for the workload with pids.max;
// every process it starts is cloned into that group (CLONE_INTO_CGROUP,
// from the spawner thread, the only thread of the agent that may: it
// keeps CAP_DAC_OVERRIDE effective for that, as the group's files belong
// to root), and everything those fork stays there. The agent itself stays
// in the root group, out of the workload's limits; the workload, which has
// no capabilities, can neither write the group's files nor leave it.
//
// gVisor enforces pids.max itself (fork answers EAGAIN): a fork bomb ends
// there. It does not enforce memory limits (memory.max is recorded, nothing
// more), and the host's out-of-memory killer can only kill the whole
// sentry; so the agent watches the group's memory use, which gVisor
// accounts per cgroup, and when it passes the limit kills the workload's
// largest process as the kernel's OOM killer would, and counts it
// (OOMKills). The host's cgroup around the sentry leaves a reserve above
// the workload's limit for the agent, the sentry and the time between two
// looks.
type workloadGroup struct {
	dir   string
	fd    int // the group's directory, for CLONE_INTO_CGROUP
	limit int64
	cur   *os.File // memory.current, kept open by watch (read at offset 0)
	kills atomic.Int64
	// native is set for the native runtime's workload leaf on cgroup v2
	// (--workload-cgroup-fd): the host's kernel enforces its limits and
	// its files are writable by the agent's own ids, so the agent only
	// clones into it.
	native bool
}

// theWorkload is set up once, before the agent serves; nil when the
// runtime did not ask for it.
var theWorkload *workloadGroup

// workloadCgroupMount is where the agent mounts gVisor's cgroup2.
const workloadCgroupMount = "/sys/fs/cgroup"

// Look at the group's memory every memPollFast while it is above half its
// limit. Below, look again before the workload could reach the limit
// allocating memFillRate bytes a second, but no sooner than memPollSlow and
// no later than memPollMax (memPollInterval). Each look is a system call
// through gVisor's platform (a signal round trip under systrap): looking
// every 20 ms, as before, cost an idle sandbox about 5% of a CPU
// (docs/benchmarks.md, "Concurrent creates"), 50 idle sandboxes more than
// this two-core host has. memFillRate is well above what gVisor's page
// faults allow (about 1.2 GB/s measured with a memset-like Python
// allocation here), so the watcher still sees the group before it passes
// its limit, and the host's reserve above the limit (MemoryReserve plus
// 4 MiB a pid) covers faster hosts.
const (
	memPollFast = 5 * time.Millisecond
	memPollSlow = 20 * time.Millisecond
	memPollMax  = 250 * time.Millisecond
	memFillRate = 4 << 30 // bytes a second
)

// memPollInterval is how long the watcher waits before it looks again at a
// group using used bytes of limit.
func memPollInterval(used, limit int64) time.Duration {
	if used > limit/2 {
		return memPollFast
	}
	d := time.Duration(float64(limit-used) / memFillRate * float64(time.Second))
	return min(max(d, memPollSlow), memPollMax)
}

// After a kill, the group's use may stay over the limit for up to
// memSettle while gVisor frees the victim's memory, unless it grows by more
// than memSlack meanwhile.
const (
	memSettle = 2 * time.Second
	memSlack  = 16 << 20
)

// workloadCgroupArg finds "--workload-cgroup=MEMORY:PIDS" in args.
func workloadCgroupArg(args []string) (mem int64, pids int64, ok bool, err error) {
	for _, arg := range args {
		v, found := strings.CutPrefix(arg, "--workload-cgroup=")
		if !found {
			continue
		}
		m, p, cut := strings.Cut(v, ":")
		mem, err1 := strconv.ParseInt(m, 10, 64)
		pids, err2 := strconv.ParseInt(p, 10, 64)
		if !cut || err1 != nil || err2 != nil || mem <= 0 || pids <= 0 {
			return 0, 0, false, fmt.Errorf("bad --workload-cgroup %q (want MEMORY:PIDS, both positive)", v)
		}
		return mem, pids, true, nil
	}
	return 0, 0, false, nil
}

// workloadLeafArg finds "--workload-cgroup-fd=N" in args: the native
// runtime on cgroup v2 hands the agent its workload's cgroup leaf as fd N
// (native.Start, cgroups.V2Split), and every process the agent starts is
// cloned into it.
func workloadLeafArg(args []string) (int, bool, error) {
	for _, arg := range args {
		v, found := strings.CutPrefix(arg, "--workload-cgroup-fd=")
		if !found {
			continue
		}
		fd, err := strconv.Atoi(v)
		if err != nil || fd < 3 {
			return 0, false, fmt.Errorf("bad --workload-cgroup-fd %q (want a descriptor above stderr)", v)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return 0, false, fmt.Errorf("--workload-cgroup-fd=%d: not an open directory (%v)", fd, err)
		}
		unix.CloseOnExec(fd)
		return fd, true, nil
	}
	return 0, false, nil
}

// setupWorkloadCgroup makes the workload's group when args ask for it. It
// must run while the agent is root inside gVisor, before mountTmpfs drops
// its privileges.
func setupWorkloadCgroup(args []string) error {
	if fd, ok, err := workloadLeafArg(args); err != nil || ok {
		if ok {
			theWorkload = &workloadGroup{fd: fd, native: true}
		}
		return err
	}
	mem, pids, ok, err := workloadCgroupArg(args)
	if err != nil || !ok {
		return err
	}
	if err := unix.Mount("cgroup2", workloadCgroupMount, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount gVisor's cgroup2 at %s (runsc --in-sandbox-cgroup=v2): %w", workloadCgroupMount, err)
	}
	if err := os.WriteFile(workloadCgroupMount+"/cgroup.subtree_control", []byte("+memory +pids"), 0); err != nil {
		return fmt.Errorf("workload cgroup: enable memory and pids: %w", err)
	}
	dir := workloadCgroupMount + "/workload"
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("workload cgroup: %w", err)
	}
	// memory.max is recorded by gVisor, not enforced: the watch enforces it.
	for _, f := range []struct {
		name string
		v    int64
	}{{"pids.max", pids}, {"memory.max", mem}} {
		if err := os.WriteFile(dir+"/"+f.name, []byte(strconv.FormatInt(f.v, 10)), 0); err != nil {
			return fmt.Errorf("workload cgroup: %s: %w", f.name, err)
		}
		if b, err := os.ReadFile(dir + "/" + f.name); err != nil || strings.TrimSpace(string(b)) != strconv.FormatInt(f.v, 10) {
			return fmt.Errorf("workload cgroup: %s reads %q (%v), want %d", f.name, b, err, f.v)
		}
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("workload cgroup: %w", err)
	}
	theWorkload = &workloadGroup{dir: dir, fd: fd, limit: mem}
	return nil
}

// join gives the calling thread (the spawner's) CAP_DAC_OVERRIDE in its
// effective set, which CLONE_INTO_CGROUP needs (the group's cgroup.procs
// and the root's belong to root), and starts watching the group's memory.
// Capabilities are per thread: the agent's other threads keep kill, setuid
// and setgid only, and the processes the spawner starts lose everything at
// exec.
func (w *workloadGroup) join() error {
	if w == nil || w.native {
		return nil
	}
	// Raise dac_override, permitted to both agent identities (a workload
	// user's and a uid-0 workload's, whose permitted set also holds the
	// root capabilities it hands on), keeping every other set as it is.
	hdr := [capUserHeadLen]uint32{linuxCapV3, 0}
	var data [2]struct{ effective, permitted, inheritable uint32 }
	if _, _, e := syscall.RawSyscall(sysCapget, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data)), 0); e != 0 {
		return fmt.Errorf("spawner: capget: %w", e)
	}
	data[0].effective |= 1 << unix.CAP_DAC_OVERRIDE
	if _, _, e := syscall.RawSyscall(sysCapset, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data)), 0); e != 0 {
		return fmt.Errorf("spawner: capset: %w", e)
	}
	go w.watch()
	return nil
}

// sysProcAttr puts a process the spawner starts into the workload's group.
func (w *workloadGroup) sysProcAttr(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	if w != nil {
		a.UseCgroupFD, a.CgroupFD = true, w.fd
	}
	return a
}

// usage is the group's memory use as gVisor accounts it: one read at
// offset 0 of memory.current, kept open (gVisor generates the file anew
// for each read from its start), instead of an open, a stat, two reads and
// a close each time.
func (w *workloadGroup) usage() (int64, error) {
	if w.cur == nil {
		f, err := os.Open(w.dir + "/memory.current")
		if err != nil {
			return 0, err
		}
		w.cur = f
	}
	var b [32]byte
	n, err := w.cur.ReadAt(b[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		w.cur.Close()
		w.cur = nil
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b[:n])), 10, 64)
}

// watch kills the group's largest process whenever its memory use passes
// the limit. It runs for the life of the agent.
func (w *workloadGroup) watch() {
	for {
		u, err := w.usage()
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock agent: workload memory: %v\n", err)
			time.Sleep(time.Second)
			continue
		}
		if u > w.limit {
			w.oomKill(u)
			continue
		}
		time.Sleep(memPollInterval(u, w.limit))
	}
}

// oomKill kills the workload's process with the most resident memory,
// counts it, and waits (a little) for its memory to go.
func (w *workloadGroup) oomKill(used int64) {
	b, err := os.ReadFile(w.dir + "/cgroup.procs")
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: workload memory %d over %d, and its processes cannot be listed: %v\n", used, w.limit, err)
		time.Sleep(memPollFast)
		return
	}
	victim, most := 0, int64(-1)
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 1 {
			continue
		}
		if r := residentBytes(pid); r > most {
			victim, most = pid, r
		}
	}
	if victim == 0 {
		time.Sleep(memPollFast)
		return
	}
	// Counted before the kill: whoever sees the process die sees the count.
	w.kills.Add(1)
	syscall.Kill(victim, syscall.SIGKILL)
	fmt.Fprintf(os.Stderr, "airlock agent: workload memory %d over its limit %d: killed pid %d (resident %d)\n", used, w.limit, victim, most)

	// gVisor gives a dead process's memory back in the background: its
	// group's use may stay over the limit a while after it has gone.
	// Another kill waits until the victim has exited and either its memory
	// has gone or what remains keeps growing past memSlack (another process
	// allocating), or memSettle has passed.
	var gone time.Time
	for deadline := time.Now().Add(memSettle + 2*time.Second); time.Now().Before(deadline); time.Sleep(memPollFast) {
		u, err := w.usage()
		if err != nil || u <= w.limit {
			return
		}
		if gone.IsZero() {
			if st, err := os.ReadFile("/proc/" + strconv.Itoa(victim) + "/stat"); err != nil || bytes.Contains(st, []byte(") Z ")) {
				gone = time.Now()
			}
			continue
		}
		if u > used+memSlack || time.Since(gone) > memSettle {
			return
		}
	}
}

// residentBytes is a process's resident memory, -1 if unknown.
func residentBytes(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return -1
	}
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return -1
	}
	return n * int64(os.Getpagesize())
}

// workloadOOMKills is how many workload processes the agent has killed for
// memory.
func workloadOOMKills() int64 {
	if theWorkload == nil {
		return 0
	}
	return theWorkload.kills.Load()
}
