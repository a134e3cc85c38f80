package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// UnitMiB is the unit of the density figure: MiB per sandbox.
const UnitMiB = "MiB"

// Idle is one idle sandbox started for the density figure.
type Idle struct {
	// Root is a host pid of the sandbox. The sandbox's processes are the
	// members of Root's memory cgroup when that cgroup is its own (not the
	// bench's), plus Root and all its descendants.
	Root int
	// Stop kills the sandbox and releases what it holds, and says if it
	// could not.
	Stop func() error
	// Exec, if set, runs argv to completion inside the live sandbox and
	// fails unless it exits 0. Peers with Peer.CanExec set it.
	Exec func(argv []string) error
	// Cgroup, if set, is the sandbox's own memory cgroup directory when
	// Root is not in it (a gvisor sandbox's `runsc run` waits outside the
	// cgroup its sentry and gofer run in): its members and kernel memory
	// are counted too.
	Cgroup string
	// Settle, if set, is what the start left for after its timed part:
	// finding the sandbox's host processes (Root, Cgroup), which only the
	// density figure reads. A timed figure calls it (through settle) once
	// its clock has stopped; startSettled calls it at once. It fails when
	// the sandbox's processes cannot be found; the caller then stops the
	// sandbox.
	Settle func() error
}

// settle runs i.Settle once, if set.
func (i *Idle) settle() error {
	s := i.Settle
	if s == nil {
		return nil
	}
	i.Settle = nil
	return s()
}

// startSettled starts an idle sandbox of p and settles it (Idle.Settle),
// stopping it if that fails.
func startSettled(p Peer, argv []string) (*Idle, error) {
	idle, err := p.StartIdle(argv)
	if err != nil {
		return nil, err
	}
	if err := idle.settle(); err != nil {
		idle.Stop()
		return nil, err
	}
	return idle, nil
}

// DensityOptions configures Density.
type DensityOptions struct {
	// Max is the most sandboxes started per peer; zero means 100.
	Max int
	// Budget is the most memory (bytes) the sandboxes of one peer may
	// cost, as measured right after each start; zero means 2 GiB.
	Budget int64
	// StartTime bounds the time spent starting one peer's sandboxes; zero
	// means 10 seconds.
	StartTime time.Duration
	// HostFloor stops starting sandboxes when the host's MemAvailable
	// falls below it, whatever the budget; zero means 1 GiB.
	HostFloor int64
	// Progress, if set, receives one line per peer.
	Progress func(format string, args ...any)
}

func (o *DensityOptions) defaults() {
	if o.Max <= 0 {
		o.Max = 100
	}
	if o.Budget <= 0 {
		o.Budget = 2 << 30
	}
	if o.StartTime <= 0 {
		o.StartTime = 10 * time.Second
	}
	if o.HostFloor <= 0 {
		o.HostFloor = 1 << 30
	}
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
}

// DensityResult is what the density figure measured for one peer.
type DensityResult struct {
	// Started is the number of idle sandboxes started.
	Started int `json:"started"`
	// Alive is how many of them were still running when all had started
	// and been measured (and, for peers that can exec, ran /bin/true).
	Alive int `json:"alive"`
	// StoppedBy says why no more were started: "max", "budget", "time",
	// "host memory" or "error".
	StoppedBy string `json:"stopped_by"`
	// StartSeconds is the time spent starting them.
	StartSeconds float64 `json:"start_seconds"`
	// PSSMiB is the median over sandboxes of the summed PSS of each
	// sandbox's processes.
	PSSMiB float64 `json:"pss_mib"`
	// KernelMiB is the median over sandboxes of the kernel memory charged
	// to each sandbox's own cgroup (0 when it has none).
	KernelMiB float64 `json:"kernel_mib"`
	// KernelSource says where KernelMiB comes from.
	KernelSource string `json:"kernel_source"`
	// Processes is the median number of host processes per sandbox.
	Processes int `json:"processes"`
	// ExecChecked is how many sandboxes were asked to run a command (the
	// peers that can exec into a running sandbox); ExecAnswered how many
	// ran it successfully.
	ExecChecked  int `json:"exec_checked,omitempty"`
	ExecAnswered int `json:"exec_answered,omitempty"`
	// HostKernelDeltaMiB is the growth of the host's kernel memory (Slab +
	// KernelStack + PageTables + Percpu in /proc/meminfo) from before the
	// first start to after the last, divided by Started. It includes what
	// no cgroup is charged for (namespaces made at clone time), and
	// everything else the shared host did meanwhile, so it is indicative
	// only.
	HostKernelDeltaMiB float64 `json:"host_kernel_delta_mib"`
}

// densityProbe is the command every density sandbox that can exec must run.
var densityProbe = []string{"/bin/true"}

// Density starts idle sandboxes running argv for every peer that can, one
// peer after another, until opts.Max run, their cost reaches opts.Budget,
// opts.StartTime has passed or the host runs low on memory. It then
// measures what each sandbox costs, PSS of its processes plus kernel memory
// from its own cgroup, checks that every one is still running, and stops
// them all; a sandbox of a peer that can exec into it (Peer.CanExec) must also
// run /bin/true. The samples are the per-sandbox costs in MiB, in start order;
// the ratio pairs airlock's i-th sandbox with the peer's i-th.
func Density(peers []Peer, argv []string, opts DensityOptions) Figure {
	opts.defaults()
	fig := Figure{Name: "density", Unit: UnitMiB, Command: append([]string(nil), argv...)}
	fig.Note = fmt.Sprintf("per sandbox: PSS of its processes (sum of Pss in /proc/PID/smaps_rollup, once per address space: processes sharing one, as gVisor's systrap stubs do, are counted once) + kernel memory of its own cgroup "+
		"(v1 memory.kmem.usage_in_bytes; else usage_in_bytes minus the processes' RSS; v2 memory.stat kernel); "+
		"up to %d sandboxes or %s per peer, peers one after another (not alternated); at the end every sandbox must be alive "+
		"and, where the peer can exec into it, run /bin/true; "+
		"the host kernel delta per sandbox (Slab+KernelStack+PageTables+Percpu) also covers namespace objects charged to no sandbox cgroup",
		opts.Max, formatBytes(opts.Budget))
	fig.Results = make([]PeerResult, len(peers))
	self := memCgroup(os.Getpid())
	for i, p := range peers {
		r := &fig.Results[i]
		r.Peer, r.Note = p.Name, p.Note
		if p.IdleNote != "" {
			r.Note = p.IdleNote
		}
		switch {
		case p.Missing != "":
			r.Missing = p.Missing
			continue
		case p.StartIdle == nil:
			r.Missing = "cannot start an idle sandbox: " + orUnknownReason(p.IdleMissing)
			continue
		}
		opts.Progress("density: %s", p.Name)
		densityPeer(p, argv, opts, self, r)
		if n := len(r.rounds); n > fig.Rounds {
			fig.Rounds = n
		}
	}
	// Pad every peer's rounds to the same length so ratios pair by index.
	for i := range fig.Results {
		r := &fig.Results[i]
		if r.rounds == nil {
			continue
		}
		for len(r.rounds) < fig.Rounds {
			r.rounds = append(r.rounds, math.NaN())
		}
	}
	fig.summarise()
	removeDensityCgroups()
	return fig
}

func orUnknownReason(s string) string {
	if s == "" {
		return "not supported"
	}
	return s
}

// densityPeer measures one peer into r.
func densityPeer(p Peer, argv []string, opts DensityOptions, self string, r *PeerResult) {
	if p.Prepare != nil {
		if err := p.Prepare(); err != nil {
			r.Error = "prepare: " + err.Error()
			if p.Cleanup != nil {
				p.Cleanup()
			}
			return
		}
	}
	if p.Cleanup != nil {
		defer p.Cleanup()
	}
	var idles []*Idle
	defer func() {
		if err := stopAll(idles); err != nil {
			r.Error = strings.TrimPrefix(r.Error+"; stop: "+err.Error(), "; ")
		}
	}()

	d := &DensityResult{StoppedBy: "max"}
	kernel0 := hostKernelBytes()
	var total int64
	start := time.Now()
	for len(idles) < opts.Max {
		if time.Since(start) > opts.StartTime {
			d.StoppedBy = "time"
			break
		}
		if avail := memAvailable(); avail > 0 && avail < opts.HostFloor {
			d.StoppedBy = "host memory"
			break
		}
		idle, err := startSettled(p, argv)
		if err != nil {
			r.Error = fmt.Sprintf("start sandbox %d: %v", len(idles)+1, err)
			d.StoppedBy = "error"
			break
		}
		idles = append(idles, idle)
		c := measureSandbox(idle, self)
		total += c.pss + c.kernel
		if total >= opts.Budget {
			d.StoppedBy = "budget"
			break
		}
	}
	d.StartSeconds = time.Since(start).Seconds()
	d.Started = len(idles)
	if d.Started == 0 {
		if r.Error == "" {
			r.Error = "no sandbox started"
		}
		return
	}
	// Let late starters settle before the final measurement.
	time.Sleep(200 * time.Millisecond)
	kernel1 := hostKernelBytes()
	if kernel0 > 0 && kernel1 > 0 {
		d.HostKernelDeltaMiB = float64(kernel1-kernel0) / float64(d.Started) / (1 << 20)
	}

	costs := make([]cost, len(idles))
	errs := make([]error, len(idles))
	for i, idle := range idles {
		costs[i] = measureSandbox(idle, self)
		errs[i] = aliveErr(idle.Root)
	}
	// Then every live one that can must answer an exec, a few at a time.
	var (
		execs, execOK atomic.Int64
		wg            sync.WaitGroup
		sem           = make(chan struct{}, 4)
	)
	for i, idle := range idles {
		if errs[i] != nil || idle.Exec == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			execs.Add(1)
			if err := idle.Exec(densityProbe); err != nil {
				errs[i] = fmt.Errorf("does not answer an exec: %w", err)
				return
			}
			execOK.Add(1)
		}()
	}
	wg.Wait()
	var pss, kern, procs []float64
	r.rounds = make([]float64, 0, len(idles))
	for i, c := range costs {
		if err := errs[i]; err != nil {
			r.rounds = append(r.rounds, math.NaN())
			r.Failures++
			if r.Error == "" {
				r.Error = fmt.Sprintf("sandbox %d: %v", i+1, err)
			}
			continue
		}
		d.Alive++
		r.rounds = append(r.rounds, float64(c.pss+c.kernel)/(1<<20))
		pss = append(pss, float64(c.pss)/(1<<20))
		kern = append(kern, float64(c.kernel)/(1<<20))
		procs = append(procs, float64(c.procs))
		d.KernelSource = c.source
	}
	if len(pss) > 0 {
		d.PSSMiB, d.KernelMiB, d.Processes = Median(pss), Median(kern), int(Median(procs))
	}
	d.ExecChecked, d.ExecAnswered = int(execs.Load()), int(execOK.Load())
	r.Density = d
	check := "alive"
	if d.ExecChecked > 0 {
		check = fmt.Sprintf("alive and answering %s", densityProbe[0])
	}
	r.Detail = fmt.Sprintf("%d started (stopped by %s), %d %s; median pss %.2f + kernel %.2f MiB (%s), %d procs; host kernel delta %.2f MiB/sandbox",
		d.Started, d.StoppedBy, d.Alive, check, d.PSSMiB, d.KernelMiB, d.KernelSource, d.Processes, d.HostKernelDeltaMiB)
	opts.Progress("density: %s: %s", p.Name, r.Detail)
}

// stopAll stops the sandboxes, a few at a time, and returns the first
// error and how many failed.
func stopAll(idles []*Idle) error {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		first  error
		failed int
	)
	sem := make(chan struct{}, 4)
	for _, idle := range idles {
		if idle.Stop == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(s func() error) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := s(); err != nil {
				mu.Lock()
				failed++
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}(idle.Stop)
	}
	wg.Wait()
	if first != nil {
		return fmt.Errorf("%d of %d failed, first: %w", failed, len(idles), first)
	}
	return nil
}

// cost is one sandbox's measured memory.
type cost struct {
	pss, kernel int64 // bytes
	procs       int
	source      string
}

// measureSandbox sums the PSS of the sandbox's processes and reads its
// cgroup's kernel memory. self is the bench's memory cgroup.
func measureSandbox(idle *Idle, self string) cost {
	var c cost
	pids := map[int]bool{}
	cg := idle.Cgroup
	if cg == "" {
		cg = memCgroup(idle.Root)
	}
	own := cg != "" && cg != self
	if own {
		for _, pid := range cgroupProcs(cg) {
			pids[pid] = true
		}
	}
	for _, pid := range descendants(idle.Root) {
		pids[pid] = true
	}
	var rss int64
	var counted []int // one process per address space
	for pid := range pids {
		if slices.ContainsFunc(counted, func(o int) bool { return sameMM(pid, o) }) {
			c.procs++ // shares an address space already counted
			continue
		}
		p, r, ok := smapsRollup(pid)
		if !ok {
			continue
		}
		counted = append(counted, pid)
		c.pss += p
		rss += r
		c.procs++
	}
	switch {
	case !own:
		c.source = "none: no cgroup of its own"
	default:
		c.kernel, c.source = cgroupKernel(cg, rss)
	}
	return c
}

// memCgroupRoots are where the memory controller's hierarchy is mounted:
// v1 first, then v2.
var memCgroupRoots = []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup"}

// memCgroup returns the directory of pid's memory cgroup, or "".
func memCgroup(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	var v1, v2 string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[1] == "" && f[0] == "0" {
			v2 = f[2]
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "memory" {
				v1 = f[2]
			}
		}
	}
	if v1 != "" {
		if d := filepath.Join(memCgroupRoots[0], v1); isDir(d) {
			return d
		}
	}
	if v2 != "" {
		d := filepath.Join(memCgroupRoots[1], v2)
		if _, err := os.Stat(filepath.Join(d, "memory.current")); err == nil {
			return d
		}
	}
	return ""
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// cgroupProcs lists the processes directly in cgroup dir.
func cgroupProcs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// cgroupKernel returns the kernel memory charged to the cgroup at dir and
// where the figure comes from. rss is the summed RSS of its processes, for
// v1 kernels without kmem accounting.
func cgroupKernel(dir string, rss int64) (int64, string) {
	if v, err := readInt64(filepath.Join(dir, "memory.kmem.usage_in_bytes")); err == nil {
		return v, "memory.kmem.usage_in_bytes"
	}
	if v, err := readInt64(filepath.Join(dir, "memory.usage_in_bytes")); err == nil {
		return max(v-rss, 0), "memory.usage_in_bytes minus RSS"
	}
	if st := readKeyed(filepath.Join(dir, "memory.stat")); st != nil {
		if v, ok := st["kernel"]; ok {
			return v, "memory.stat kernel"
		}
		var sum int64
		for _, k := range []string{"slab", "kernel_stack", "pagetables", "percpu", "sock"} {
			sum += st[k]
		}
		return sum, "memory.stat slab+kernel_stack+pagetables+percpu+sock"
	}
	return 0, "none: no memory accounting"
}

func readInt64(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// readKeyed reads a "key value" file such as memory.stat.
func readKeyed(path string) map[string]int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	m := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				m[f[0]] = v
			}
		}
	}
	return m
}

// smapsRollup returns the Pss and Rss of pid in bytes.
func smapsRollup(pid int) (pss, rss int64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil || len(b) == 0 {
		return 0, 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "Pss:":
			pss = v << 10
		case "Rss:":
			rss = v << 10
		}
	}
	return pss, rss, true
}

// processTree returns every process's children, from /proc/*/stat.
func processTree() map[int][]int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	tree := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		_, ppid, ok := procStat(pid)
		if ok {
			tree[ppid] = append(tree[ppid], pid)
		}
	}
	return tree
}

// procStat returns the state letter and parent pid of pid.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil || len(f[0]) == 0 {
		return 0, 0, false
	}
	return f[0][0], ppid, true
}

// procComm returns the command name of pid.
func procComm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// descendants returns root and every process below it, from the
// /proc/PID/task/TID/children files, or from a scan of /proc where the
// kernel lacks them.
func descendants(root int) []int {
	if _, _, ok := procStat(root); !ok {
		return nil
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		kids, ok := children(out[i])
		if !ok {
			return descendantsIn(processTree(), root)
		}
		out = append(out, kids...)
	}
	return out
}

// children lists the children of every thread of pid; ok is false when the
// kernel has no children files.
func children(pid int) (kids []int, ok bool) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, true // gone
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(fmt.Sprintf("/proc/%d/task/%s", pid, t.Name())); serr == nil {
				return nil, false // the thread exists but not its children file
			}
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if k, err := strconv.Atoi(f); err == nil {
				kids = append(kids, k)
			}
		}
	}
	return kids, true
}

// descendantsIn returns root and every process below it in tree.
func descendantsIn(tree map[int][]int, root int) []int {
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, tree[out[i]]...)
	}
	return out
}

// aliveErr reports why pid is not a running process, or nil.
func aliveErr(pid int) error {
	st, _, ok := procStat(pid)
	switch {
	case !ok:
		return fmt.Errorf("process %d is gone", pid)
	case st == 'Z' || st == 'X':
		return fmt.Errorf("process %d has exited", pid)
	}
	return nil
}

// startIdleProcess starts name args in the background (stdin and stdout on
// /dev/null, stderr kept in a file for errors) and waits until a process
// named like the idle command (the last path element of the first argument
// after the options, e.g. "sleep") runs in its process tree. Stop kills
// the whole tree.
func startIdleProcess(spec runSpec, name string, args ...string) (*Idle, error) {
	want := idleComm(name, args)
	errf, err := os.CreateTemp("", "bench-idle-")
	if err != nil {
		return nil, err
	}
	os.Remove(errf.Name())
	cmd := exec.Command(name, args...)
	cmd.Dir = spec.dir
	if spec.env != nil {
		cmd.Env = append(os.Environ(), spec.env...)
	}
	cmd.Stderr = errf
	if err := cmd.Start(); err != nil {
		errf.Close()
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() error {
		defer errf.Close()
		for _, pid := range descendants(cmd.Process.Pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		select {
		case <-exited:
			return nil
		case <-time.After(5 * time.Second):
			return fmt.Errorf("%s (pid %d) still running 5s after SIGKILL", filepath.Base(name), cmd.Process.Pid)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, pid := range descendants(cmd.Process.Pid) {
			if procComm(pid) == want {
				return &Idle{Root: cmd.Process.Pid, Stop: stop}, nil
			}
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", errf.Fd()))
			errf.Close()
			return nil, fmt.Errorf("%s exited before %s ran: %s: %s", filepath.Base(name), want, cmd.ProcessState, oneLine(string(b)))
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("%s: %s did not start within 10s", filepath.Base(name), want)
		}
	}
}

// idleComm guesses the command name of the idle program in a peer's
// command line: the first argument that names an executable file after
// "--" or "-c", or the program itself.
func idleComm(name string, args []string) string {
	for i, a := range args {
		if a == "--" && i+1 < len(args) {
			return filepath.Base(args[i+1])
		}
		if a == "-c" && i+1 < len(args) {
			if f := strings.Fields(args[i+1]); len(f) > 0 {
				return filepath.Base(strings.Trim(f[0], "'"))
			}
		}
	}
	return filepath.Base(name)
}

// densityCgroupParent is the cgroup (below each hierarchy's root) under
// which the container peers' idle sandboxes are placed.
func densityCgroupParent() string { return fmt.Sprintf("airlock-bench-%d", os.Getpid()) }

// removeDensityCgroups removes the (by now empty) parent cgroups the
// container runtimes created for the density figure.
func removeDensityCgroups() {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + densityCgroupParent())
	if d := "/sys/fs/cgroup/" + densityCgroupParent(); isDir(d) {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		subs, _ := filepath.Glob(d + "/*")
		for _, s := range subs {
			if isDir(s) {
				os.Remove(s)
			}
		}
		os.Remove(d)
	}
}

// meminfo reads /proc/meminfo in bytes.
func meminfo() map[string]int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil
	}
	m := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n <<= 10
		}
		m[k] = n
	}
	return m
}

// hostKernelBytes is the host's kernel memory that grows with sandboxes.
func hostKernelBytes() int64 {
	m := meminfo()
	return m["Slab"] + m["KernelStack"] + m["PageTables"] + m["Percpu"]
}

// memAvailable is the host's MemAvailable, or 0 if unknown.
func memAvailable() int64 { return meminfo()["MemAvailable"] }

// formatBytes formats n in binary units.
func formatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
