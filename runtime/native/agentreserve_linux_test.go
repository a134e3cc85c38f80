package native_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

var (
	agentBinOnce sync.Once
	agentBinPath string
	agentBinErr  error
)

// agentBinary is the agent for agent sandboxes: $AIRLOCK_TEST_AGENT (the
// cgroup v2 guest, internal/cgroup2vm, has no Go toolchain), else
// cmd/airlock-agent built once.
func agentBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("AIRLOCK_TEST_AGENT"); p != "" {
		return p
	}
	agentBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "native-agent-")
		if err != nil {
			agentBinErr = err
			return
		}
		os.Chmod(dir, 0o755)
		agentBinPath = filepath.Join(dir, "airlock-agent")
		cmd := exec.Command("go", "build", "-o", agentBinPath, "github.com/airlock-dev/airlock/cmd/airlock-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentBinErr = fmt.Errorf("build agent: %v\n%s", err, out)
		}
	})
	if agentBinErr != nil {
		t.Fatal(agentBinErr)
	}
	return agentBinPath
}

// TestAgentReserveV2 (cgroup v2; internal/cgroup2vm runs it in a guest
// with only cgroup2): an agent sandbox's agent and workload live in
// sibling leaves of the sandbox's group; every workload process is
// cloned into the workload leaf (its /proc/self/cgroup names it at exec
// time, no window in the parent), and a fork bomb holding every pid of
// the workload's limit, or a memory hog at its memory limit, leaves the
// agent answering.
func TestAgentReserveV2(t *testing.T) {
	if info := cgroups.Detect(); info.Version != 2 || info.Reason != "" {
		t.Skipf("needs cgroup v2 with memory and pids (internal/cgroup2vm runs it in a guest); this host: %s %s", info.Describe(), info.Reason)
	}
	bin := agentBinary(t)
	p := strict(t)
	p.Limits.Pids = 24
	p.Limits.MemoryBytes = 96 << 20
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostEnd, agentEnd := os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "agent")
	sb, err := native.Start(native.Config{Policy: p, Agent: true, AgentBinary: bin,
		Args: []string{native.AgentPath, "__agent"}, Stdin: agentEnd, Stderr: os.Stderr})
	agentEnd.Close()
	if err != nil {
		hostEnd.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy() })
	reserve := ""
	for _, l := range sb.Enforced() {
		if l.Name == "agent_reserve" {
			reserve = string(l.State) + ": " + l.Detail
		}
	}
	if !strings.HasPrefix(reserve, "ok: cgroup v2") {
		t.Fatalf("agent_reserve layer %q, want ok on cgroup v2", reserve)
	}
	conn, err := net.FileConn(hostEnd)
	hostEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	c, err := agent.NewClientConfig(conn, agent.Config{Home: "/workspace"})
	if err != nil {
		t.Fatalf("agent hello: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if err := sb.ReserveAgent(c.SpawnerTid()); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sb.Pid))
	if err != nil {
		t.Fatal(err)
	}
	group := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(string(raw)), "0::"), "/"+cgroups.AgentLeafName)
	if !strings.HasSuffix(strings.TrimSpace(string(raw)), "/"+sb.ID+"/"+cgroups.AgentLeafName) {
		t.Fatalf("agent (init) in %q, want the agent leaf of %s", raw, sb.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	exec := func(shell string) (string, agent.ExitStatus) {
		t.Helper()
		pr, err := c.Exec(ctx, agent.ExecRequest{Shell: shell})
		if err != nil {
			t.Fatalf("exec %q: %v", shell, err)
		}
		out, errOut, _, st, err := pr.Collect(ctx, 1<<20)
		if err != nil {
			t.Fatalf("exec %q: %v", shell, err)
		}
		return string(out) + string(errOut), st
	}
	// At exec time, and in every process the workload forks.
	if out, st := exec("cat /proc/self/cgroup; sh -c 'cat /proc/self/cgroup'"); out != "0::/workload\n0::/workload\n" || st.Code != 0 {
		t.Fatalf("workload's /proc/self/cgroup: %q (%+v), want 0::/workload twice", out, st)
	}
	// clone3 passes seccomp here (the agent needs it): no namespace can
	// be made with it, the sandbox's user namespace allows none.
	const clone3NewUser = `import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
for name, flag in (("user", 0x10000000), ("net", 0x40000000), ("cgroup", 0x02000000)):
    args = ctypes.create_string_buffer(struct.pack("11Q", flag, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0))
    r = libc.syscall(435, args, 88)
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
    print(name, r, ctypes.get_errno())
`
	if out, st := exec("python3 -c '" + clone3NewUser + "'"); st.Code != 0 || out != "user -1 28\nnet -1 1\ncgroup -1 1\n" {
		t.Fatalf("clone3 with new namespaces in the workload: %q (%+v), want -1 with ENOSPC (user, refused by the namespace limit) or EPERM", out, st)
	}
	cgfs := "/sys/fs/cgroup" + group
	readInt := func(f string) int64 {
		b, err := os.ReadFile(cgfs + "/" + f)
		if err != nil {
			t.Fatal(err)
		}
		var v int64
		fmt.Sscan(string(b), &v)
		return v
	}
	if got := readInt("workload/pids.max"); got != p.Limits.Pids {
		t.Fatalf("workload leaf pids.max = %d, want %d", got, p.Limits.Pids)
	}
	alive := func(what string) {
		t.Helper()
		for i := 0; i < 5; i++ {
			if err := c.Ping(ctx); err != nil {
				t.Fatalf("%s: the agent does not answer: %v", what, err)
			}
			if _, err := c.Stat(ctx, "/workspace"); err != nil {
				t.Fatalf("%s: the agent cannot stat /workspace: %v", what, err)
			}
		}
	}

	// A fork bomb takes every pid of the workload's leaf and keeps them.
	bomb, err := c.Exec(ctx, agent.ExecRequest{Shell: "b() { b | b & }; b; sleep 600", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for readInt("workload/pids.current") < p.Limits.Pids {
		if time.Now().After(deadline) {
			t.Fatalf("the bomb never filled the workload's %d pids (%d)", p.Limits.Pids, readInt("workload/pids.current"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	alive("fork bomb at the workload's pids limit")
	if n := readInt("workload/pids.events"); n < 0 {
		t.Fatal("pids.events unreadable")
	}
	t.Logf("bomb holds %d pids in the workload leaf; the agent leaf has %d", readInt("workload/pids.current"), readInt("agent/pids.current"))
	bomb.Close()
	if _, err := c.KillProcesses(ctx); err != nil {
		t.Fatalf("kill the bomb: %v", err)
	}
	for readInt("workload/pids.current") > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the bomb's %d processes outlived KillProcesses", readInt("workload/pids.current"))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A memory hog runs into the workload's memory limit and is killed
	// there; the agent, outside that limit, answers on.
	out, st := exec("exec python3 -c 'b = []\nwhile True: b.append(bytearray(4 << 20))'")
	if st.Signal != "SIGKILL" {
		t.Fatalf("memory hog ended %+v (%q), want killed by the OOM killer", st, out)
	}
	if peak := readInt("workload/memory.peak"); peak > p.Limits.MemoryBytes {
		t.Errorf("workload leaf peaked at %d bytes, above its %d limit", peak, p.Limits.MemoryBytes)
	}
	if n, err := sb.OOMKills(); err != nil || n < 1 {
		t.Errorf("OOMKills = %d, %v; want the hog counted", n, err)
	}
	alive("after the memory hog")
}
