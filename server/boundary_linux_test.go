package server_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// tracemePy makes the exec'd process (whose parent is the agent) or one of
// its threads call ptrace(PTRACE_TRACEME) and take a signal.
const tracemePy = `
import ctypes, os, signal, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def traceme():
    if libc.ptrace(0, 0, 0, 0) != 0:
        sys.exit("PTRACE_TRACEME failed: errno %d" % ctypes.get_errno())
signal.signal(signal.SIGUSR1, lambda *a: None)
`

// TestExecTracemeNeverFakesExit: a process that makes the agent its tracer
// and stops is never reported as exited 0 while it is alive and stopped; the
// agent kills it, and the sandbox goes on serving (light profile, which
// allows ptrace).
func TestExecTracemeNeverFakesExit(t *testing.T) {
	b := boundaryServer(t, "traceme")
	c, ctx := b.c, b.ctx
	sb, err := c.Create(ctx, client.CreateRequest{Profile: "light", Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"process": `traceme(); os.kill(os.getpid(), signal.SIGUSR1); print("resumed")`,
		"thread": `
def t():
    traceme(); signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
th = threading.Thread(target=t); th.start(); th.join(); time.sleep(30); print("resumed")`,
	} {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", tracemePy + body}, Timeout: 20})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%s: %+v", name, res)
		if strings.Contains(res.Stderr, "PTRACE_TRACEME failed") {
			t.Fatalf("%s: the light profile must allow ptrace: %s", name, res.Stderr)
		}
		if res.ExitCode == 0 || strings.Contains(res.Stdout, "resumed") || res.Signal != "SIGKILL" || res.Status == "timeout" {
			t.Errorf("%s: exit %d signal %q status %q stdout %q: want killed by SIGKILL at its ptrace-stop", name, res.ExitCode, res.Signal, res.Status, res.Stdout)
		}
		// Nothing of it is left, checked from the host.
		for _, pid := range pidsInCgroup(t, sb.ID) {
			if cl, _ := readCmdline(pid); strings.Contains(cl, "traceme") {
				t.Errorf("%s: process %d (%q) survived", name, pid, cl)
			}
		}
	}
	execAlive(t, c, ctx, sb.ID, "sandbox did not survive")
	// The workload still traces its own processes (a debugger's way).
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", tracemePy + `
pid = os.fork()
if pid == 0:
    traceme(); os.kill(os.getpid(), signal.SIGSTOP); os._exit(7)
_, st = os.waitpid(pid, 0)
assert os.WIFSTOPPED(st), st
libc.ptrace(7, pid, 0, 0)  # PTRACE_CONT
_, st = os.waitpid(pid, 0)
print("traced-ok", os.WEXITSTATUS(st))`}, Timeout: 30})
	if err != nil || strings.TrimSpace(res.Stdout) != "traced-ok 7" {
		t.Fatalf("the light profile must let the workload trace its own child: %+v %v", res, err)
	}
}

// pidsInCgroup lists the host pids in the sandbox's cgroups (every
// controller's directory and child cgroups), read on the host.
func pidsInCgroup(t testing.TB, id string) []int {
	t.Helper()
	seen := map[int]bool{}
	var out []int
	for _, dir := range cgroupDirs(id) {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// readCmdline returns a host process's command line, NULs as spaces.
func readCmdline(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.ReplaceAll(string(b), "\x00", " "), err
}

// reachAgentPy tries every way a workload process has to reach the agent
// (PID 1) and prints one line per attempt: "NAME ok" if it got through.
const reachAgentPy = `
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, f):
    try:
        r = f()
        if isinstance(r, int) and r < 0:
            print(name, "denied", ctypes.get_errno())
        else:
            print(name, "ok")
    except OSError as e:
        print(name, "denied", e.errno)
def openread(p):
    with open(p, "rb") as f:
        f.read(1)
attempt("mem", lambda: openread("/proc/1/mem"))
attempt("environ", lambda: openread("/proc/1/environ"))
attempt("fd-list", lambda: os.listdir("/proc/1/fd"))
attempt("fd-open", lambda: os.open("/proc/1/fd/0", os.O_RDONLY))
attempt("fd-log", lambda: os.open("/proc/1/fd/2", os.O_WRONLY))
attempt("ptrace-attach", lambda: libc.ptrace(16, 1, 0, 0))
class rlimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]
attempt("prlimit", lambda: libc.prlimit(1, 7, ctypes.byref(rlimit(3, 3)), None))
# SIGSEGV with si_code SI_QUEUE: the Go runtime would take it for a fault.
info = (ctypes.c_int * 32)(signal.SIGSEGV, 0, -1)
attempt("sigqueue-segv", lambda: libc.syscall(129, 1, signal.SIGSEGV, info))
for s in ("SEGV", "ABRT", "BUS", "SYS", "TRAP", "ILL", "FPE", "STKFLT", "TERM", "HUP", "KILL", "STOP"):
    attempt("kill-" + s, lambda: os.kill(1, getattr(signal, "SIG" + s)))
`

// TestAgentOutOfReach: in every profile, the workload can neither read the
// agent's memory, environment or descriptors, nor trace, prlimit or signal
// it; the agent survives every attempt (checked on the host: same process,
// still serving), runs under a uid of its own with only kill, setuid and
// setgid, and the files it writes belong to the workload's user.
func TestAgentOutOfReach(t *testing.T) {
	b := boundaryServer(t, "reach")
	c, ctx := b.c, b.ctx
	for _, profile := range []string{"strict", "standard", "light"} {
		t.Run(profile, func(t *testing.T) {
			sb, err := c.Create(ctx, client.CreateRequest{Profile: profile, Timeout: 300})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Kill(ctx, sb.ID)
			pid := initPid(t, b.state, sb.ID)
			before, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				t.Fatal(err)
			}
			res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", reachAgentPy}, Timeout: 30})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, "kill-STOP") {
				t.Fatalf("probe did not run: %+v", res)
			}
			t.Logf("probe: %s", res.Stdout)
			for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
				if strings.HasSuffix(line, " ok") {
					t.Errorf("the workload reached the agent: %s", line)
				}
			}
			// The same agent process lives on and serves.
			time.Sleep(100 * time.Millisecond)
			after, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil || startField(after) != startField(before) {
				t.Fatalf("agent %d is gone after the probe: %v", pid, err)
			}
			if _, err := c.WriteFile(ctx, sb.ID, "/workspace/owned", strings.NewReader("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "stat -c %u:%g /workspace/owned; id -u; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status"})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(res.Stdout, "1000:1000\n1000\n") || strings.Count(res.Stdout, "0000000000000000") != 5 {
				t.Errorf("workload identity: %q, want files and processes of 1000:1000 with no capabilities", res.Stdout)
			}
			// From the host: the agent's uid differs from the workload's, and
			// it holds kill, setgid and setuid only, with an empty bounding set.
			st := hostStatusOf(t, pid)
			if st["CapEff"] != "00000000000000e0" || st["CapPrm"] != "00000000000000e0" || st["CapBnd"] != "0000000000000000" ||
				st["CapAmb"] != "0000000000000000" || st["CapInh"] != "0000000000000000" {
				t.Errorf("agent capabilities %v", st)
			}
			if strings.Fields(st["Uid"])[0] == "" || strings.Fields(st["Uid"])[0] == workloadHostUID(t, c, sb.ID) {
				t.Errorf("agent uid %q is the workload's", st["Uid"])
			}
		})
	}
}

// startField returns field 22 (start time) of a /proc/PID/stat line.
func startField(stat []byte) string {
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// hostStatusOf reads /proc/PID/status on the host.
func hostStatusOf(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// workloadHostUID is the host uid of a workload process of the sandbox,
// which it checks (on the host) holds no capabilities and no_new_privs.
func workloadHostUID(t *testing.T, c *client.Client, id string) string {
	t.Helper()
	pid, err := c.Start(ctxT(t), id, client.ExecRequest{Argv: []string{"sleep", "30"}, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Signal(ctxT(t), id, pid, "KILL")
	// The process may not have exec'd sleep yet when Start answers: poll.
	var hp int
	eventually(t, 30*time.Second, "the workload's sleep on the host", func() bool {
		for _, p := range pidsInCgroup(t, id) {
			if cl, _ := readCmdline(p); strings.HasPrefix(cl, "sleep 30") {
				hp = p
				return true
			}
		}
		return false
	})
	st := hostStatusOf(t, hp)
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if st[k] != "0000000000000000" {
			t.Errorf("workload process %s = %s, want no capabilities", k, st[k])
		}
	}
	if st["NoNewPrivs"] != "1" {
		t.Errorf("workload process NoNewPrivs = %s", st["NoNewPrivs"])
	}
	return strings.Fields(st["Uid"])[0]
}

// sandboxProcs counts the sandbox's processes on the host whose command
// line contains marker.
func sandboxProcs(t testing.TB, id, marker string) int {
	n := 0
	for _, pid := range pidsInCgroup(t, id) {
		if cl, _ := readCmdline(pid); strings.Contains(cl, marker) {
			n++
		}
	}
	return n
}

// TestForegroundExecTreeEnds: a foreground exec's process tree ends with
// it (a fork bomb on strict, a forgotten "&"), so the next exec runs at
// once; and POST .../kill-processes ends every workload process, background
// and escaped ones included, while the sandbox and its files live on.
func TestForegroundExecTreeEnds(t *testing.T) {
	b := boundaryServer(t, "tree")
	c, ctx := b.c, b.ctx
	sb, err := c.Create(ctx, client.CreateRequest{Profile: "strict", Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	// A fork bomb returns at once with exit 0, its copies running on.
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "b() { b | b & }; b", Timeout: 10})
	t.Logf("bomb: %+v %v", res, err)
	// The very next exec runs (no retries: the bomb's slots must be free).
	execAlive(t, c, ctx, sb.ID, "exec after the fork bomb")
	// A forgotten background job of a foreground command ends with it.
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "sleep 1001 & echo started"})
	if err != nil || !strings.Contains(res.Stdout, "started") {
		t.Fatalf("exec: %+v %v", res, err)
	}
	eventually(t, 10*time.Second, "the foreground exec's child ends", func() bool { return sandboxProcs(t, sb.ID, "sleep 1001") == 0 })

	// kill-processes: background processes, an escaped (setsid) one.
	if _, err := c.WriteFile(ctx, sb.ID, "/workspace/keep", strings.NewReader("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, sb.ID, client.ExecRequest{Shell: "sleep 1002 & sleep 1003", Background: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, sb.ID, client.ExecRequest{Shell: "setsid sleep 1004", Background: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "background processes run", func() bool { return sandboxProcs(t, sb.ID, "sleep 100") >= 3 })
	agentPid := initPid(t, b.state, sb.ID)
	n, err := c.KillProcesses(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n < 3 {
		t.Errorf("kill-processes killed %d, want at least 3", n)
	}
	// Its answer comes once the killed are reaped: a listing right after
	// it (E2B's connect with onResume "reboot" does one) shows none running.
	procs, err := c.Processes(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.Running {
			t.Errorf("listed as running right after kill-processes: %+v", p)
		}
	}
	eventually(t, 10*time.Second, "every workload process ends", func() bool { return sandboxProcs(t, sb.ID, "sleep 100") == 0 })
	if !alive(agentPid) {
		t.Fatal("kill-processes killed the agent")
	}
	kept, err := c.ReadFile(ctx, sb.ID, "/workspace/keep")
	if err != nil || string(kept) != "kept" {
		t.Fatalf("files after kill-processes: %q %v", kept, err)
	}
	execAlive(t, c, ctx, sb.ID, "exec after kill-processes")
}

// fillPidsPy forks sleepers until fork fails, then holds every slot.
const fillPidsPy = `
import os, sys, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(1000)
        os._exit(0)
    n += 1
print("filled", n, flush=True)
time.sleep(1000)
`

// TestPidsExhaustedIs429: when the workload holds every pid slot, exec and
// context creation answer 429 limit_reached (not 500/502), the agent lives
// on, and kill-processes gives the slots back.
func TestPidsExhaustedIs429(t *testing.T) {
	b := boundaryServer(t, "pids")
	c, ctx := b.c, b.ctx
	sb, err := c.Create(ctx, client.CreateRequest{Profile: "strict", Limits: &client.Limits{Pids: 64}, Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := c.Start(ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", fillPidsPy}, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the filler holds every slot", func() bool {
		ps, err := c.Processes(ctx, sb.ID)
		if err != nil {
			return false
		}
		for _, p := range ps {
			if p.Pid == pid {
				return sandboxProcs(t, sb.ID, "python3") > 1
			}
		}
		return false
	})
	time.Sleep(500 * time.Millisecond) // let the filler reach its first failed fork
	var apiErr *client.Error
	_, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}})
	if !errors.As(err, &apiErr) || apiErr.Status != 429 || apiErr.Code != "limit_reached" {
		t.Errorf("exec with every pid taken: %v, want 429 limit_reached", err)
	}
	_, err = c.CreateContext(ctx, sb.ID, client.ContextRequest{Language: "python"})
	if !errors.As(err, &apiErr) || apiErr.Status != 429 || apiErr.Code != "limit_reached" {
		t.Errorf("context with every pid taken: %v, want 429 limit_reached", err)
	}
	if _, err := c.KillProcesses(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	execAlive(t, c, ctx, sb.ID, "exec after kill-processes")
}

// TestContextsFillPidsAgentLives reproduces issue 15's crash: JavaScript
// contexts (7-8 pids each) created while file operations run fill the strict
// profile's 128 pids; the agent needed a new OS thread and died. Now the
// workload's limit is its own and the agent keeps a reserve: every create
// succeeds or answers 429 limit_reached, never 5xx, and the agent (same
// process, checked on the host) serves on. The agent's threads are outside
// the workload's cgroup.
func TestContextsFillPidsAgentLives(t *testing.T) {
	b := boundaryServer(t, "ctxpids")
	c, ctx := b.c, b.ctx
	for round := 0; round < 2; round++ {
		// Strict's pids limit is what this is about; its 1-CPU quota only
		// slows 24 node starts on a loaded 2-core host past the kernel's
		// start timeout (a 500 that is not the property under test).
		sb, err := c.Create(ctx, client.CreateRequest{Profile: "strict", Timeout: 300, Limits: &client.Limits{CPUs: float64(runtime.NumCPU())}})
		if err != nil {
			t.Fatal(err)
		}
		pid := initPid(t, b.state, sb.ID)
		before, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if n := agentThreadsInWorkload(t, pid); n != 1 {
			t.Errorf("%d agent threads in the workload's cgroup, want only the spawner", n)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < 3; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				p := fmt.Sprintf("/workspace/f%d", i)
				for {
					select {
					case <-stop:
						return
					default:
					}
					c.WriteFile(ctx, sb.ID, p, strings.NewReader("data"), 0o644)
					c.ReadFile(ctx, sb.ID, p)
					c.ListFiles(ctx, sb.ID, "/workspace", 1)
				}
			}(i)
		}
		var created, limited int
		var errs sync.Map
		var cwg sync.WaitGroup
		var mu sync.Mutex
		for i := 0; i < 24; i++ {
			cwg.Add(1)
			go func() {
				defer cwg.Done()
				_, err := c.CreateContext(ctx, sb.ID, client.ContextRequest{Language: "javascript"})
				var apiErr *client.Error
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					created++
				case errors.As(err, &apiErr) && apiErr.Status == 429:
					limited++
				default:
					errs.Store(err.Error(), true)
				}
			}()
		}
		cwg.Wait()
		close(stop)
		wg.Wait()
		t.Logf("round %d: %d contexts created, %d limited", round, created, limited)
		errs.Range(func(k, _ any) bool { t.Errorf("round %d: context create: %v", round, k); return true })
		after, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || startField(after) != startField(before) {
			t.Fatalf("round %d: the agent died: %v", round, err)
		}
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"echo", "alive"}})
		if err != nil && !strings.Contains(err.Error(), "429") {
			t.Fatalf("round %d: exec: %v", round, err)
		}
		if err == nil && strings.TrimSpace(res.Stdout) != "alive" {
			t.Fatalf("round %d: exec: %+v", round, res)
		}
		if _, err := c.KillProcesses(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		c.Kill(ctx, sb.ID)
	}
}

// agentThreadsInWorkload counts the agent's threads whose pids cgroup is
// the workload's child group, read on the host.
func agentThreadsInWorkload(t *testing.T, pid int) int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, _ := os.ReadFile(dir + "/" + e.Name() + "/cgroup")
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, ":pids:") && strings.HasSuffix(l, "/workload") {
				n++
			}
		}
	}
	return n
}

// TestWorkloadOOMSandboxSurvives: a memory hog in an exec and in a code
// cell is reported as "oom", and the sandbox (same agent process, checked on
// the host) survives with its files (strict profile, 512 MiB).
func TestWorkloadOOMSandboxSurvives(t *testing.T) {
	b := boundaryServer(t, "oom")
	c, ctx := b.c, b.ctx
	sb, err := c.Create(ctx, client.CreateRequest{Profile: "strict", Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	pid := initPid(t, b.state, sb.ID)
	before, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if _, err := c.WriteFile(ctx, sb.ID, "/workspace/keep", strings.NewReader("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	const hog = "x = b'x' * (2 << 30)"
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", hog}, Timeout: 60})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != "oom" {
		t.Errorf("exec of a memory hog: %+v, want status oom", res)
	}
	if got := execStreamStatus(t, c, ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", hog}, Timeout: 60}); got != "oom" {
		t.Errorf("streamed exec of a memory hog: exit status %q, want oom", got)
	}
	cell, err := c.RunCode(ctx, sb.ID, client.CodeRequest{Code: hog, Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if cell.Status != "oom" {
		t.Errorf("code cell of a memory hog: %+v, want status oom", cell)
	}
	after, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil || startField(after) != startField(before) {
		t.Fatalf("the agent died: %v", err)
	}
	kept, err := c.ReadFile(ctx, sb.ID, "/workspace/keep")
	if err != nil || string(kept) != "kept" {
		t.Fatalf("files after the OOM: %q %v", kept, err)
	}
	execAlive(t, c, ctx, sb.ID, "exec after the OOM")
	// After a server restart the reattached sandbox reports oom too.
	b.s.crash()
	s2 := startServer(t, b.state)
	c = client.New(s2.URL, b.key)
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", hog}, Timeout: 60})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != "oom" {
		t.Errorf("exec of a memory hog in a reattached sandbox: %+v, want status oom", res)
	}
}

// bserver is a server for one boundary test, with a key and a client.
type bserver struct {
	state, key string
	s          *srv
	c          *client.Client
	ctx        context.Context
}

func boundaryServer(t *testing.T, name string) *bserver {
	needRoot(t)
	b := &bserver{state: stateDir(t)}
	b.key = newKey(t, b.state, name)
	b.s = startServer(t, b.state)
	b.c = client.New(b.s.URL, b.key)
	b.ctx = ctxT(t)
	return b
}

// execAlive fails the test unless the sandbox runs a command at once.
func execAlive(t *testing.T, c *client.Client, ctx context.Context, id, what string) {
	t.Helper()
	res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"echo", "alive"}})
	if err != nil || strings.TrimSpace(res.Stdout) != "alive" {
		t.Fatalf("%s: exec: %+v %v", what, res, err)
	}
}
