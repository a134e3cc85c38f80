package gvisor_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/internal/probe/probebuild"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/runtime/native"
)

// The runtime-neutral hostile tests (fork, memory, disk and output bombs,
// timeout, host files, writes outside, network...) run under gVisor from
// runtime/native's TestGVisor. These are the gVisor-specific ones.

// needRunsc skips when runsc is not installed (scripts/setup.sh installs it).
func needRunsc(t testing.TB) {
	t.Helper()
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
}

func gvPolicy(t testing.TB, mod func(*policy.Policy)) policy.Policy {
	t.Helper()
	p, err := policy.Preset(policy.Strict)
	if err != nil {
		t.Fatal(err)
	}
	p.Runtime = policy.RuntimeGVisor
	if mod != nil {
		mod(&p)
	}
	return p
}

func gvRun(t testing.TB, mod func(*policy.Policy), argv ...string) *native.Result {
	t.Helper()
	needRunsc(t)
	res, err := gvisor.Run(context.Background(), native.Config{Policy: gvPolicy(t, mod), Args: argv}, native.RunOptions{Capture: true})
	if err != nil {
		t.Fatalf("run %q: %v", argv, err)
	}
	return res
}

func TestEchoAndExit(t *testing.T) {
	res := gvRun(t, nil, "/bin/sh", "-c", "echo out; echo err >&2; exit 3")
	if res.Status != native.StatusNonzeroExit || res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" {
		t.Fatalf("got %+v", res)
	}
	res = gvRun(t, nil, "/bin/sh", "-c", "kill -9 $$")
	if res.Status != native.StatusKilled || res.ExitCode != 137 || res.Signal != "killed" {
		t.Fatalf("kill -9: got %+v", res)
	}
}

// TestUnameIsGVisor: the program talks to gVisor's kernel, not the host's.
func TestUnameIsGVisor(t *testing.T) {
	var host unix.Utsname
	if err := unix.Uname(&host); err != nil {
		t.Fatal(err)
	}
	hostRel := unix.ByteSliceToString(host.Release[:])
	res := gvRun(t, nil, "uname", "-r")
	got := strings.TrimSpace(res.Stdout)
	if res.Status != native.StatusOK || got == hostRel || !strings.Contains(got, "gvisor") {
		t.Fatalf("uname -r inside = %q (status %s), host %q: want gVisor's kernel", got, res.Status, hostRel)
	}
}

// TestEnforcedReport: the layers say what gVisor does, with runsc's version.
func TestEnforcedReport(t *testing.T) {
	res := gvRun(t, nil, "true")
	rs, _ := gvisor.Find()
	g, ok := res.Enforced.Get("gvisor")
	if !ok || g.State != "ok" || !strings.Contains(g.Detail, rs.Version) || !strings.Contains(g.Detail, "systrap") {
		t.Fatalf("gvisor layer %+v", g)
	}
	for _, name := range []string{"seccomp", "filesystem", "netns", "cgroup"} {
		if l, ok := res.Enforced.Get(name); !ok || l.State != "ok" {
			t.Errorf("layer %s: %+v", name, l)
		}
	}
	if _, ok := res.Enforced.Get("landlock"); ok {
		t.Error("a gVisor run reports Landlock, which it does not apply")
	}
	// runsc drops tmpfs's nr_inodes (TestInodeFloodHitsMemoryLimit): the
	// inode limit is reported as not enforced.
	if l, ok := res.Enforced.Get("inodes"); !ok || l.State != "degraded" || !strings.Contains(l.Detail, "not enforced") {
		t.Errorf("inodes layer %+v, want degraded", l)
	}
}

// TestRuntimeMismatchRefused: neither runtime runs the other's policy.
func TestRuntimeMismatchRefused(t *testing.T) {
	p := gvPolicy(t, nil)
	if _, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"true"}}, native.RunOptions{}); err == nil || !strings.Contains(err.Error(), "gvisor") {
		t.Fatalf("native ran a gvisor policy: %v", err)
	}
	p.Runtime = "kvm"
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), `unknown "kvm"`) {
		t.Fatalf("unknown runtime accepted: %v", err)
	}
}

// TestInodeFloodHitsMemoryLimit: runsc drops tmpfs's nr_inodes, so under
// gVisor a flood of empty files is stopped by the memory limit (the
// sentry's tmpfs lives in the sandbox's memory cgroup): status oom.
func TestInodeFloodHitsMemoryLimit(t *testing.T) {
	res := gvRun(t, func(p *policy.Policy) { p.Limits.MemoryBytes = 64 << 20; p.Limits.Inodes = 500 }, "python3", "-c", `
import os
for i in range(10000000):
    open(f"/workspace/f{i}", "w").close()
`)
	if res.Status != native.StatusOOM || res.PeakMemoryBytes > 80<<20 {
		t.Fatalf("status %s peak %d, want oom within the 64 MiB limit", res.Status, res.PeakMemoryBytes)
	}
}

// dangerous are the calls that must never reach the host kernel from a
// gVisor sandbox (tracepoint name: x86-64 number). newuname is one that
// native sandboxes do pass to the host kernel: it shows the difference
// gVisor makes, since native's seccomp filter already stops the others
// before the tracepoint.
var dangerous = map[string]int{"io_uring_setup": 425, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "newuname": 63}

// callScript prints "ready", waits for a line on stdin, makes each
// dangerous call once, prints "done" and waits.
const callScript = `
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(512)
print("ready", flush=True)
sys.stdin.readline()
for name, nr, args in (("io_uring_setup", 425, (8, buf)), ("bpf", 321, (0, buf, 72)),
        ("perf_event_open", 298, (buf, 0, -1, -1, 0)), ("userfaultfd", 323, (0,)), ("keyctl", 250, (0, -3, 0)), ("newuname", 63, (buf,))):
    r = libc.syscall(nr, *args)
    print(name, r, os.strerror(ctypes.get_errno()) if r < 0 else "ok", flush=True)
print("done", flush=True)
time.sleep(60)
`

// tracer records the host kernel's sys_enter events for the dangerous
// calls in a private tracefs instance: a host-side count of which tasks
// entered them, with no seccomp or audit involved.
type tracer struct{ dir string }

func startTracer(t *testing.T) *tracer {
	t.Helper()
	base := "/sys/kernel/tracing"
	if _, err := os.Stat(filepath.Join(base, "instances")); err != nil {
		if err := unix.Mount("nodev", base, "tracefs", 0, ""); err != nil {
			t.Skipf("tracefs unavailable (%v): cannot count host system calls", err)
		}
	}
	dir := filepath.Join(base, "instances", "airlock-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	for name := range dangerous {
		ev := filepath.Join(dir, "events/syscalls/sys_enter_"+name+"/enable")
		if err := os.WriteFile(ev, []byte("1"), 0); err != nil {
			t.Skipf("syscall tracepoint for %s unavailable: %v", name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "tracing_on"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	return &tracer{dir: dir}
}

// callsBy returns the dangerous calls the trace saw from the given tids.
func (tr *tracer) callsBy(t *testing.T, tids map[int]bool) map[string]int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tr.dir, "trace"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		// "  python3-1234    [001] .....  12.34: sys_io_uring_setup(..."
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		dash := strings.LastIndexByte(f[0], '-')
		tid, err := strconv.Atoi(f[0][dash+1:])
		if err != nil || !tids[tid] {
			continue
		}
		for name := range dangerous {
			if strings.Contains(line, "sys_"+name+"(") {
				seen[name]++
			}
		}
	}
	return seen
}

// tasksOf lists the tids of every task in the sandbox's cgroup.
func tasksOf(t *testing.T, id string, into map[int]bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/airlock", id, "tasks"))
	if err != nil {
		b, err = os.ReadFile(filepath.Join("/sys/fs/cgroup/airlock", id, "cgroup.threads"))
	}
	if err != nil {
		t.Fatalf("tasks of sandbox %s: %v", id, err)
	}
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			into[n] = true
		}
	}
}

// TestDangerousCallsNeverReachHostKernel: io_uring_setup, bpf,
// perf_event_open, userfaultfd and keyctl made by a program inside gVisor
// are answered by the sentry; the host kernel's syscall tracepoints see
// none of them from any task of the sandbox. A control run of the same
// program directly on the host shows the tracepoints do see them.
func TestDangerousCallsNeverReachHostKernel(t *testing.T) {
	needRunsc(t)
	tr := startTracer(t)

	// Control: the same calls made on the host are seen.
	ctl := exec.Command("/usr/bin/python3", "-c", strings.Replace(callScript, "time.sleep(60)", "", 1))
	ctl.Stdin = strings.NewReader("go\n")
	if out, err := ctl.CombinedOutput(); err != nil {
		t.Fatalf("control run: %v: %s", err, out)
	}
	if got := tr.callsBy(t, map[int]bool{ctl.Process.Pid: true}); len(got) != len(dangerous) {
		t.Fatalf("the tracer saw only %v of the host run's calls: the check would prove nothing", got)
	}

	// The sandbox makes them too, and stays up while its tasks are listed.
	// The trace is cleared once the program is ready, so that gVisor's own
	// start (runsc asks the host for uname) is not counted.
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer inW.Close()
	p := gvPolicy(t, nil)
	id := native.NewID()
	sb, err := gvisor.Start(native.Config{ID: id, Policy: p, Args: []string{"python3", "-c", callScript}, Stdin: inR, Stdout: outW, Stderr: outW})
	outW.Close()
	inR.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	tids := map[int]bool{}
	var inside []string
	sc := bufio.NewScanner(outR)
	deadline := time.AfterFunc(60*time.Second, func() { sb.Kill() })
	defer deadline.Stop()
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("program inside did not start: %q", sc.Text())
	}
	tasksOf(t, id, tids)
	if err := os.WriteFile(filepath.Join(tr.dir, "trace"), nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := inW.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		tasksOf(t, id, tids) // stubs are created as the program runs: collect them all
		if sc.Text() == "done" {
			break
		}
		inside = append(inside, sc.Text())
	}
	if len(inside) != len(dangerous) {
		t.Fatalf("program inside printed %q, want one line per call", inside)
	}
	tasksOf(t, id, tids)
	t.Logf("inside gVisor: %q; %d host tasks in the sandbox's cgroup", inside, len(tids))
	if got := tr.callsBy(t, tids); len(got) != 0 {
		t.Fatalf("the host kernel saw %v from the sandbox's tasks", got)
	}
	for _, l := range inside {
		if f := strings.Fields(l); len(f) > 2 && f[2] == "ok" && f[0] != "keyctl" && f[0] != "newuname" {
			t.Errorf("%s succeeded inside gVisor: %q", f[0], l)
		}
	}
}

// TestNotFoundIsSetupError: a missing command is a setup error with exit
// code 127, as under native.
func TestNotFoundIsSetupError(t *testing.T) {
	needRunsc(t)
	res, err := gvisor.Run(context.Background(), native.Config{Policy: gvPolicy(t, nil), Args: []string{"no-such-command-xyz"}}, native.RunOptions{})
	if !errors.Is(err, native.ErrNotFound) || res.ExitCode != 127 || res.Status != native.StatusSetupError {
		t.Fatalf("got %v, %+v", err, res)
	}
}

// TestSetupInstallsPinnedVersion: scripts/setup.sh installs the runsc
// this package is tested with.
func TestSetupInstallsPinnedVersion(t *testing.T) {
	b, err := os.ReadFile("../../scripts/setup.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "RUNSC_VERSION="+gvisor.Version+"\n") {
		t.Fatalf("scripts/setup.sh does not pin runsc %s", gvisor.Version)
	}
}

// TestNothingLeftBehind: after a run that is killed at its deadline, the
// sandbox's bundle, runsc's state and every cgroup directory named after
// it (airlock's and those runsc made in the other hierarchies) are gone.
func TestNothingLeftBehind(t *testing.T) {
	needRunsc(t)
	id := native.NewRunID()
	p := gvPolicy(t, func(p *policy.Policy) { p.Limits.WallTime = time.Second })
	res, err := gvisor.Run(context.Background(), native.Config{ID: id, Policy: p, Args: []string{"sleep", "60"}}, native.RunOptions{})
	if err != nil || res.Status != native.StatusTimeout {
		t.Fatalf("run: %v %+v", err, res)
	}
	left, _ := filepath.Glob("/sys/fs/cgroup/*/airlock/" + id)
	for _, pat := range []string{filepath.Join(gvisor.StateBase, "bundles", id), filepath.Join(gvisor.StateBase, "root", "*"+id+"*")} {
		m, _ := filepath.Glob(pat)
		left = append(left, m...)
	}
	if len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestWorkspaceDir: a host workspace that does not exist is created for
// the sandbox user and what the sandbox writes lands there, owned by that
// uid; an existing directory of another owner is refused with what to do.
func TestWorkspaceDir(t *testing.T) {
	needRunsc(t)
	dir := filepath.Join(t.TempDir(), "ws")
	res := gvRun(t, func(p *policy.Policy) { p.Filesystem.Workspace = dir }, "/bin/sh", "-c", "echo data > /workspace/out.txt")
	if res.Status != native.StatusOK {
		t.Fatalf("run: %+v", res)
	}
	fi, err := os.Stat(filepath.Join(dir, "out.txt"))
	if err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Fatalf("out.txt on the host: %v %+v", err, fi)
	}
	other := t.TempDir() // owned by root
	p := gvPolicy(t, func(p *policy.Policy) { p.Filesystem.Workspace = other })
	if _, err := gvisor.Run(context.Background(), native.Config{Policy: p, Args: []string{"true"}}, native.RunOptions{}); err == nil || !strings.Contains(err.Error(), "does not ID-map a root-owned directory") {
		t.Fatalf("root-owned workspace: %v", err)
	}
}

// TestInt80Refused: a 32-bit system call (int 0x80) made inside gVisor is
// refused by the sentry (native sandboxes kill the process): it answers
// ENOSYS, or, on some host kernels (6.18.44-fc-v782 here; v669 answered
// ENOSYS), the systrap platform turns the gate into a fault the probe
// reports as "fault" (exit 3). Either way getpid never runs: a pid is a
// failure.
func TestInt80Refused(t *testing.T) {
	needRunsc(t)
	bin := probebuild.Build(t)
	res := gvRun(t, func(p *policy.Policy) {
		p.Filesystem.Mounts = append(p.Filesystem.Mounts, policy.Mount{Source: filepath.Dir(bin), Target: "/probe"})
	}, "/probe/"+filepath.Base(bin), "int80")
	enosys := strings.Contains(res.Stdout, "pid=-38")
	fault := strings.HasPrefix(res.Stdout, "fault:") && res.ExitCode == 3
	if !enosys && !fault {
		t.Fatalf("int 0x80 getpid inside gVisor: %+v, want ENOSYS (-38) or a fault", res)
	}
}

// TestCheckpointRestore: a checkpointed sandbox stops (its processes are
// gone from the host, its memory freed) and comes back from the image with
// its memory intact, talking over the new stdio it was restored with.
func TestCheckpointRestore(t *testing.T) {
	needRunsc(t)
	counter := "import sys\nn = 0\nbig = bytearray(32 << 20)\nfor line in sys.stdin:\n    n += 1\n    print(n, line.strip(), len(big), flush=True)\n"
	pair := func() (*os.File, *os.File) { return socketPair(t) }
	say := func(f *os.File, line string) string { t.Helper(); return sayLine(t, f, line) }
	host, inside := pair()
	defer host.Close()
	sb, err := gvisor.Start(native.Config{Policy: gvPolicy(t, nil), Args: []string{"python3", "-c", counter}, Stdin: inside, Stdout: inside})
	inside.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got := say(host, "before"); got != "1 before 33554432" {
		t.Fatalf("before checkpoint: %q", got)
	}
	image := t.TempDir()
	if err := sb.Checkpoint(image); err != nil {
		sb.Destroy()
		t.Fatal(err)
	}
	if st, err := sb.Stats(); err != nil || st.Pids != 0 {
		sb.Destroy()
		t.Fatalf("after checkpoint the sandbox's cgroup holds %d tasks (%v)", st.Pids, err)
	}
	host2, inside2 := pair()
	defer host2.Close()
	sb2, err := sb.Restore(image, inside2, inside2, nil)
	inside2.Close()
	if err != nil {
		sb.Destroy()
		t.Fatal(err)
	}
	defer sb2.Destroy()
	if got := say(host2, "after"); got != "2 after 33554432" {
		t.Fatalf("after restore: %q", got)
	}
	if st, err := sb2.Stats(); err != nil || st.Pids == 0 {
		t.Fatalf("the restored sandbox is not in its cgroup: %+v %v", st, err)
	}
}

// TestFinishCheckpointWaitsForStop: FinishCheckpoint, settling a
// checkpoint it finds running (as a restarted server does after a kill mid
// pause), calls the image whole once the sandbox has stopped: runsc
// checkpoint returns before the sandbox's process has exited, and a look
// in between must not call the sandbox running (the old code did, and the
// server recorded a paused sandbox lost). A sandbox whose checkpoint never
// began is reported not whole, and it runs on.
func TestFinishCheckpointWaitsForStop(t *testing.T) {
	needRunsc(t)
	host, inside := socketPair(t)
	defer host.Close()
	sb, err := gvisor.Start(native.Config{Policy: gvPolicy(t, nil), Args: []string{"python3", "-c", "import sys\nbig = bytearray(64 << 20)\nfor line in sys.stdin:\n    print(line.strip(), flush=True)\n"}, Stdin: inside, Stdout: inside})
	inside.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	if got := sayLine(t, host, "up"); got != "up" {
		t.Fatalf("before checkpoint: %q", got)
	}
	image := t.TempDir()
	whole, err := gvisor.FinishCheckpoint(sb.ID, image, time.Minute)
	if err != nil || whole {
		t.Fatalf("no checkpoint began: whole %v (%v), want not whole", whole, err)
	}
	if got := sayLine(t, host, "still"); got != "still" {
		t.Fatalf("after settling a checkpoint that never began: %q", got)
	}
	done := make(chan error, 1)
	go func() { done <- sb.Checkpoint(image) }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		if fi, err := os.Stat(filepath.Join(image, "checkpoint.img")); err == nil && fi.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("runsc checkpoint never began the image")
		}
	}
	whole, err = gvisor.FinishCheckpoint(sb.ID, image, 2*time.Minute)
	if err != nil || !whole {
		t.Fatalf("settling a checkpoint that wrote its image: whole %v (%v), want whole", whole, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
