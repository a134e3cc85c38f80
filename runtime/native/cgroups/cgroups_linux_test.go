package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// These tests use the real cgroupfs of the machine they run on (CI runs
// them as root). Group names carry the test process id so that concurrent
// runs on one machine do not collide.

const mib = 1 << 20

// needHost skips unless running as root with usable cgroups.
func needHost(t *testing.T) *host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to manage cgroups")
	}
	h := current()
	if h.info.Version == 0 {
		t.Skipf("no usable cgroups: %s", h.info.Reason)
	}
	return h
}

var nameSeq atomic.Int64

// testName returns a unique valid group name for t.
func testName(t *testing.T) string {
	var b strings.Builder
	for _, r := range strings.ToLower(t.Name()) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return fmt.Sprintf("t%d-%d-%s", os.Getpid(), nameSeq.Add(1), b.String())
}

// mustCreate creates a group and destroys it at the end of the test.
func mustCreate(t *testing.T, h *host, l Limits) *Group {
	t.Helper()
	g, err := h.create(testName(t), l)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() {
		if err := g.Destroy(); err != nil {
			t.Errorf("cleanup destroy: %v", err)
		}
	})
	return g
}

// held is a shell that waits on its stdin before running its script, so
// that it can be moved into a group before it does anything.
type held struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	done   chan error
}

func startHeld(t *testing.T, script string) *held {
	t.Helper()
	p := &held{done: make(chan error, 1)}
	p.cmd = exec.Command("/bin/sh", "-c", "read _go; "+script)
	p.cmd.Stderr = &p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// release lets the held shell run its script.
func (p *held) release(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	p.stdin.Close()
}

// wait waits for the shell to exit.
func (p *held) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		t.Fatalf("process %d still running after %v; stderr: %s", p.cmd.Process.Pid, timeout, p.stderr.String())
		return nil
	}
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func wantFile(t *testing.T, path, want string) {
	t.Helper()
	if got := readTrim(t, path); got != want {
		t.Errorf("%s = %q, want %q", path, got, want)
	}
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func assertEmpty(t *testing.T, g *Group) {
	t.Helper()
	for _, d := range g.dirs {
		if got := readTrim(t, d+"/cgroup.procs"); got != "" {
			t.Errorf("%s/cgroup.procs not empty: %q", d, got)
		}
	}
}

func assertGone(t *testing.T, g *Group) {
	t.Helper()
	for _, d := range g.dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists (stat: %v)", d, err)
		}
	}
}

func TestDetect(t *testing.T) {
	info := Detect()
	t.Logf("detected: %+v", info)
	if os.Geteuid() != 0 || info.Version == 0 {
		return
	}
	if info.Root == "" {
		t.Error("Root is empty")
	}
	for _, c := range info.Controllers {
		if !contains([]string{"memory", "pids", "cpu", "cpuacct"}, c) {
			t.Errorf("unexpected controller %q", c)
		}
		if c == "cpuacct" && info.Version != 1 {
			t.Errorf("cpuacct reported on v%d", info.Version)
		}
	}
	again := Detect()
	again.Controllers[0] = "mutated"
	if Detect().Controllers[0] == "mutated" {
		t.Error("Detect shares its Controllers slice with callers")
	}
}

func TestCreateAppliesLimitsAndAccounts(t *testing.T) {
	h := needHost(t)
	g := mustCreate(t, h, Limits{MemoryBytes: 64 * mib, CPUs: 0.5, Pids: 16})
	t.Log(g.Describe())
	if want := describe(h.info.Version, h.info.Controllers); g.Describe() != want {
		t.Errorf("Describe() = %q, want %q", g.Describe(), want)
	}
	if !strings.HasSuffix(g.dirs[0], "/"+g.Name()) {
		t.Errorf("group dir %s does not end in its name %s", g.dirs[0], g.Name())
	}
	switch h.info.Version {
	case 1:
		wantFile(t, g.memDir+"/memory.limit_in_bytes", strconv.Itoa(64*mib))
		if _, err := os.Stat(g.memDir + "/memory.memsw.limit_in_bytes"); err == nil {
			wantFile(t, g.memDir+"/memory.memsw.limit_in_bytes", strconv.Itoa(64*mib))
		}
		wantFile(t, g.memDir+"/memory.swappiness", "0")
		wantFile(t, g.pidsDir+"/pids.max", "16")
		wantFile(t, g.cpuDir+"/cpu.cfs_period_us", "100000")
		wantFile(t, g.cpuDir+"/cpu.cfs_quota_us", "50000")
	case 2:
		d := g.dirs[0]
		wantFile(t, d+"/memory.max", strconv.Itoa(64*mib))
		if _, err := os.Stat(d + "/memory.swap.max"); err == nil {
			wantFile(t, d+"/memory.swap.max", "0")
		}
		wantFile(t, d+"/memory.oom.group", "1")
		wantFile(t, d+"/pids.max", "16")
		wantFile(t, d+"/cpu.max", "50000 100000")
	}

	// A real child, moved in before it runs its script: burn some CPU,
	// then sleep.
	p := startHeld(t, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exec sleep 60")
	if err := g.Add(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.dirs {
		if got := readTrim(t, d+"/cgroup.procs"); got != strconv.Itoa(p.cmd.Process.Pid) {
			t.Errorf("%s/cgroup.procs = %q, want the child's pid %d", d, got, p.cmd.Process.Pid)
		}
	}
	p.release(t)
	eventually(t, 90*time.Second, "the child to use CPU and start sleeping", func() bool {
		st, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p.cmd.Process.Pid))
		return st.CPUTime > 10*time.Millisecond && strings.TrimSpace(string(comm)) == "sleep"
	})
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: %+v", st)
	if h.info.Has("pids") && st.Pids != 1 {
		t.Errorf("Stats().Pids = %d, want 1", st.Pids)
	}
	if h.info.Has("memory") && (st.MemoryBytes <= 0 || st.PeakMemoryBytes < st.MemoryBytes && h.info.Version == 1) {
		t.Errorf("memory accounting looks wrong: %+v", st)
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, g)
	if err := p.wait(t, 5*time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("child exit = %v, want killed", err)
	}
	if err := g.Destroy(); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
	if err := g.Kill(); err != nil {
		t.Errorf("Kill after Destroy: %v", err)
	}
	if _, err := g.Stats(); err == nil {
		t.Error("Stats after Destroy succeeded")
	}
}

func TestMemoryLimitOOMKill(t *testing.T) {
	h := needHost(t)
	if !h.info.Has("memory") {
		t.Skip("no memory controller: " + h.info.Reason)
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 as the memory hog")
	}
	g := mustCreate(t, h, Limits{MemoryBytes: 64 * mib, CPUs: 1, Pids: 16})
	p := startHeld(t, `exec /usr/bin/python3 -c "b=bytearray(200<<20)"`)
	if err := g.Add(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	p.release(t)
	err := p.wait(t, 30*time.Second)
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("hog exit = %v, want killed by the OOM killer; stderr: %s", err, p.stderr.String())
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats after OOM: %+v", st)
	if st.OOMKills < 1 {
		t.Errorf("Stats().OOMKills = %d, want >= 1", st.OOMKills)
	}
	// The exec path reads the counter alone (before and after each
	// command): it must agree with Stats.
	if n, err := g.OOMKills(); err != nil || n != st.OOMKills {
		t.Errorf("OOMKills() = %d, %v; want %d (Stats)", n, err, st.OOMKills)
	}
	if st.PeakMemoryBytes <= 0 {
		if h.info.Version == 2 {
			if _, err := os.Stat(g.memDir + "/memory.peak"); err != nil {
				t.Skip("kernel has no memory.peak")
			}
		}
		t.Errorf("Stats().PeakMemoryBytes = %d, want > 0", st.PeakMemoryBytes)
	}
	if st.PeakMemoryBytes > 64*mib {
		t.Errorf("peak %d exceeds the 64 MiB limit", st.PeakMemoryBytes)
	}
}

func TestPidsLimitStopsForkLoop(t *testing.T) {
	h := needHost(t)
	if !h.info.Has("pids") {
		t.Skip("no pids controller: " + h.info.Reason)
	}
	g := mustCreate(t, h, Limits{MemoryBytes: 256 * mib, CPUs: 1, Pids: 16})
	// The sleeps must not hold the shell's stderr pipe open, or waiting
	// for the shell would wait for them.
	p := startHeld(t, `i=0; while [ $i -lt 64 ]; do sleep 60 </dev/null >/dev/null 2>&1 & i=$((i+1)); done; echo "forked $i" >&2`)
	if err := g.Add(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	p.release(t)
	err := p.wait(t, 20*time.Second)
	stderr := p.stderr.String()
	t.Logf("shell: %v; stderr: %s", err, stderr)
	if !strings.Contains(stderr, "fork") || strings.Contains(stderr, "forked 64") {
		t.Errorf("the fork loop was not stopped (exit %v)", err)
	}
	st, serr := g.Stats()
	if serr != nil {
		t.Fatal(serr)
	}
	if st.Pids < 1 || st.Pids > 16 {
		t.Errorf("Stats().Pids = %d, want 1..16", st.Pids)
	}
	if max, found, err := readKey(g.pidsDir+"/pids.events", "max"); err == nil && found && max < 1 {
		t.Errorf("pids.events max = %d, want >= 1", max)
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, g)
}

func TestKillForkBomb(t *testing.T) {
	h := needHost(t)
	g := mustCreate(t, h, Limits{MemoryBytes: 256 * mib, CPUs: 1, Pids: 32})
	// Every process forks as fast as it can; children do the same.
	p := startHeld(t, `f() { while :; do ( f ) & sleep 0.01; done; }; f`)
	if err := g.Add(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	p.release(t)
	eventually(t, 10*time.Second, "the fork bomb to grow", func() bool {
		pids, err := g.procs()
		if err != nil {
			t.Fatal(err)
		}
		return len(pids) >= 8
	})
	start := time.Now()
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed the fork bomb in %v", time.Since(start))
	assertEmpty(t, g)
	if g.freezerDir != "" && h.info.Version == 1 {
		wantFile(t, g.freezerDir+"/freezer.state", "THAWED")
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, g)
}

func TestDestroyEmptyAndChildGroups(t *testing.T) {
	h := needHost(t)
	g, err := h.create(testName(t), Limits{MemoryBytes: 32 * mib, CPUs: 0.1, Pids: 4})
	if err != nil {
		t.Fatal(err)
	}
	// A nested group (as a sandbox with cgroupfs access could make) must
	// not block removal.
	if err := os.Mkdir(filepath.Join(g.dirs[0], "nested"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, g)
	if err := g.Destroy(); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
}

func TestCreateRejects(t *testing.T) {
	h := needHost(t)
	for _, name := range []string{"", "Upper", "a/b", "..", "a.b", "a_b", strings.Repeat("a", maxNameLen+1)} {
		if g, err := h.create(name, Limits{}); err == nil {
			g.Destroy()
			t.Errorf("create(%q) succeeded", name)
		}
	}
	for _, l := range []Limits{{MemoryBytes: -1}, {Pids: -1}, {CPUs: -0.5}, {CPUs: math.NaN()}, {CPUs: math.Inf(1)}} {
		if _, err := h.create(testName(t), l); err == nil {
			t.Errorf("invalid limits %+v accepted", l)
		}
	}
	g := mustCreate(t, h, Limits{Pids: 8})
	if _, err := h.create(g.Name(), Limits{Pids: 8}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("creating an existing group: err = %v, want 'already exists'", err)
	}
	// The failed duplicate must not have removed the original.
	for _, d := range g.dirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("original group dir: %v", err)
		}
	}
	if err := g.Add(0); err == nil {
		t.Error("Add(0) succeeded")
	}
}

func TestCleanupStale(t *testing.T) {
	h := needHost(t)
	orphan, err := h.create(testName(t), Limits{MemoryBytes: 64 * mib, CPUs: 1, Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	kept := mustCreate(t, h, Limits{Pids: 16})
	cmd := exec.Command("/bin/sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	if err := orphan.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	// Forget the handle, as a crashed launcher would. Only our orphan is
	// eligible: other groups on this machine may belong to someone else.
	removed, err := h.cleanupStale(func(name string) bool { return name != orphan.Name() })
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != orphan.Name() {
		t.Errorf("removed %v, want [%s]", removed, orphan.Name())
	}
	assertGone(t, orphan)
	for _, d := range kept.dirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("kept group was touched: %v", err)
		}
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "killed") {
			t.Errorf("orphan's process exit = %v, want killed", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("orphan's process survived CleanupStale")
	}
}

// cgroup v2 on the hybrid host's /sys/fs/cgroup/unified (or on the main
// mount of a pure v2 host).

var v2Seq atomic.Int64

// unifiedHost returns a host creating groups in a fresh directory on this
// machine's cgroup2 mount, removed after the test. With enable, it turns
// on whatever controllers the mount offers (none on this hybrid host).
func unifiedHost(tb testing.TB, enable bool) *host {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root to manage cgroups")
	}
	m, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		tb.Fatal(err)
	}
	if m.v2 == "" {
		tb.Skip("no cgroup2 filesystem mounted")
	}
	root := filepath.Join(m.v2, fmt.Sprintf("airlock-test-%d-%d", os.Getpid(), v2Seq.Add(1)))
	h, err := v2At(m.v2, root, enable)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := removeCgroup(root, time.Now().Add(5*time.Second)); err != nil {
			tb.Errorf("remove test root: %v", err)
		}
	})
	return h
}

func TestV2CreateStatsKillDestroy(t *testing.T) {
	h := unifiedHost(t, true)
	t.Logf("cgroup2 test host: %+v", h.info)
	g := mustCreate(t, h, Limits{})
	if g.Describe() != describe(2, h.info.Controllers) {
		t.Errorf("Describe() = %q", g.Describe())
	}
	p := startHeld(t, `i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 60 & sleep 60 & wait`)
	if err := g.Add(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	p.release(t)
	eventually(t, 90*time.Second, "cpu.stat usage and two sleeping children", func() bool {
		st, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		pids, err := g.procs()
		if err != nil {
			t.Fatal(err)
		}
		return st.CPUTime > 10*time.Millisecond && len(pids) == 3
	})
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: %+v", st)
	if _, err := os.Stat(g.dirs[0] + "/cgroup.kill"); err != nil {
		t.Logf("no cgroup.kill (kernel < 5.14): Kill uses the signal loop")
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, g)
	if err := p.wait(t, 5*time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("shell exit = %v, want killed", err)
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, g)
}

func TestV2KillFallbackWithoutCgroupKill(t *testing.T) {
	h := unifiedHost(t, true)
	g := mustCreate(t, h, Limits{})
	// Make the group look like a pre-5.14 kernel's: Kill must still work
	// through the signal loop (and cgroup.freeze).
	g.version = 1
	g.freezerDir = ""
	p := startHeld(t, `sleep 60 & sleep 60 & wait`)
	if err := g.Add(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	p.release(t)
	eventually(t, 10*time.Second, "two children", func() bool {
		pids, _ := g.procs()
		return len(pids) == 3
	})
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, g)
}

func TestV2MissingControllerIsClearError(t *testing.T) {
	h := unifiedHost(t, false) // nothing enabled in the test root
	if h.info.Has("memory") {
		t.Fatalf("fresh test root unexpectedly offers memory: %+v", h.info)
	}
	_, err := h.create(testName(t), Limits{MemoryBytes: 64 * mib, CPUs: 1, Pids: 16})
	if !errors.Is(err, ErrControllerMissing) {
		t.Fatalf("err = %v, want ErrControllerMissing", err)
	}
	t.Logf("error: %v", err)
	for _, want := range []string{"memory", "pids", "cpu", h.v2} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if names, _ := h.groupNames(); len(names) != 0 {
		t.Errorf("failed create left groups behind: %v", names)
	}
	none := &host{info: Info{Reason: "nothing mounted"}}
	if _, err := none.create("x", Limits{Pids: 1}); !errors.Is(err, ErrControllerMissing) || !strings.Contains(err.Error(), "nothing mounted") {
		t.Errorf("create without cgroups: err = %v", err)
	}
}

func TestV2Delegation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to set up a cgroup to delegate")
	}
	m, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if m.v2 == "" {
		t.Skip("no cgroup2 filesystem mounted")
	}
	origRel, err := ownV2Cgroup()
	if err != nil {
		t.Fatal(err)
	}
	orig := filepath.Join(m.v2, origRel)
	if _, err := delegateV2(m.v2, "/"); err == nil || !strings.Contains(err.Error(), "delegated") {
		t.Errorf("delegating the root cgroup: err = %v", err)
	}

	// Play "own cgroup": move this test process into a fresh cgroup, as
	// systemd would have started it in a delegated scope.
	ownRel := fmt.Sprintf("airlock-test-own-%d", os.Getpid())
	own := filepath.Join(m.v2, ownRel)
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := writeInt(filepath.Join(orig, "cgroup.procs"), int64(os.Getpid())); err != nil {
			t.Errorf("move test process back to %s: %v", orig, err)
		}
		if err := removeCgroup(own, time.Now().Add(5*time.Second)); err != nil {
			t.Errorf("remove %s: %v", own, err)
		}
	})
	if err := writeInt(filepath.Join(own, "cgroup.procs"), int64(os.Getpid())); err != nil {
		t.Fatal(err)
	}

	h, err := delegateV2(m.v2, ownRel)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("delegated host: %+v", h.info)
	if h.info.Root != filepath.Join(own, airlockDir) || h.info.Version != 2 {
		t.Errorf("delegated host info = %+v", h.info)
	}
	if got, _ := ownV2Cgroup(); got != "/"+ownRel+"/"+supervisorDir {
		t.Errorf("process is in %q, want it moved to the supervisor leaf", got)
	}
	if got := readTrim(t, filepath.Join(own, "cgroup.procs")); got != "" {
		t.Errorf("own cgroup still has processes: %q", got)
	}
	// A second launcher started from the supervisor leaf reuses the
	// subtree.
	h2, err := delegateV2(m.v2, "/"+ownRel+"/"+supervisorDir)
	if err != nil || h2.v2 != h.v2 {
		t.Errorf("delegating from the supervisor leaf: %v, root %q want %q", err, h2.v2, h.v2)
	}
	g, err := h.create(testName(t), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	if err := g.Add(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, g)
}

func TestReadMounts(t *testing.T) {
	const sample = `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 30 0:35 / /sys/fs/cgroup/my\040pids rw,relatime - cgroup cgroup rw,pids
39 30 0:36 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
41 30 0:37 / /mnt/other rw,relatime - cgroup2 cgroup2 rw
`
	path := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(path, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := readMounts(path)
	if err != nil {
		t.Fatal(err)
	}
	if m.v2 != "/sys/fs/cgroup/unified" {
		t.Errorf("v2 = %q", m.v2)
	}
	want := map[string]string{
		"cpu":          "/sys/fs/cgroup/cpu,cpuacct",
		"cpuacct":      "/sys/fs/cgroup/cpu,cpuacct",
		"memory":       "/sys/fs/cgroup/memory",
		"pids":         "/sys/fs/cgroup/my pids",
		"name=systemd": "/sys/fs/cgroup/systemd",
	}
	for k, v := range want {
		if m.v1[k] != v {
			t.Errorf("v1[%s] = %q, want %q", k, m.v1[k], v)
		}
	}
	if got := v1RootString([]string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu,cpuacct"}); got != "/sys/fs/cgroup/{memory,cpu,cpuacct}/airlock" {
		t.Errorf("v1RootString = %q", got)
	}
	if got := v1RootString([]string{"/a/memory", "/b/pids"}); got != "/a/memory/airlock,/b/pids/airlock" {
		t.Errorf("v1RootString = %q", got)
	}
}

func TestValidName(t *testing.T) {
	for _, n := range []string{"a", "sb-0123-abcd", strings.Repeat("z", maxNameLen)} {
		if !validName(n) {
			t.Errorf("validName(%q) = false", n)
		}
	}
	for _, n := range []string{"", "A", "a b", "a/b", ".", "..", "a_b", strings.Repeat("z", maxNameLen+1)} {
		if validName(n) {
			t.Errorf("validName(%q) = true", n)
		}
	}
}
