package microvm

import (
	"context"
	"errors"
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
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

// bootGuest starts a guest with a freshly built agent and returns it with
// a client of its agent.
func bootGuest(t *testing.T, user ...string) (*VM, *agent.Client) {
	t.Helper()
	return bootGuestWith(t, nil, user...)
}

// bootGuestWith is bootGuest with a change to the tier's configuration.
func bootGuestWith(t *testing.T, edit func(*native.Config), user ...string) (*VM, *agent.Client) {
	t.Helper()
	if err := (Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	if len(user) == 0 {
		user = []string{"--user", "1000:1000"}
	}
	dir := t.TempDir()
	bin := agentBinary(t)
	p, err := policy.Preset(policy.Standard)
	if err != nil {
		t.Fatal(err)
	}
	p.Runtime = policy.RuntimeMicroVM
	p.Network.Mode = policy.NetNone
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostEnd, stdin := os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "agent")
	logf, err := os.Create(filepath.Join(dir, "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	start := time.Now()
	cfg := native.Config{ID: fmt.Sprintf("mvt-%d-%s", os.Getpid(), filepath.Base(dir)), Policy: p,
		Args: append([]string{native.AgentPath, "__agent"}, user...), Stdin: stdin, Stdout: logf, Stderr: logf,
		Agent: true, AgentBinary: bin}
	if edit != nil {
		edit(&cfg)
	}
	inst, _, err := Tier{}.Start(cfg)
	stdin.Close()
	if err != nil {
		b, _ := os.ReadFile(logf.Name())
		t.Fatalf("start: %v\nconsole:\n%s", err, b)
	}
	vm := inst.(*VM)
	t.Cleanup(func() { vm.Destroy() })
	conn, err := net.FileConn(hostEnd)
	hostEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	c, err := agent.NewClientConfig(conn, agent.Config{Home: "/workspace"})
	if err != nil {
		b, _ := os.ReadFile(logf.Name())
		t.Fatalf("hello: %v\nconsole:\n%s", err, b)
	}
	t.Logf("boot to agent hello: %s (%s)", time.Since(start).Round(time.Millisecond), vm.Enforced()[0].Detail)
	t.Cleanup(func() { c.Close() })
	return vm, c
}

// testPolicy is the standard profile for the microvm runtime, without
// network.
func testPolicy(t *testing.T) policy.Policy {
	t.Helper()
	p, err := policy.Preset(policy.Standard)
	if err != nil {
		t.Fatal(err)
	}
	p.Runtime, p.Network.Mode = policy.RuntimeMicroVM, policy.NetNone
	return p
}

var (
	agentOnce sync.Once
	agentPath string
	agentErr  error
)

// agentBinary builds the agent once per test binary, and points the
// initramfs cache at a directory of the test's.
func agentBinary(t *testing.T) string {
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "microvm-test-")
		if err == nil {
			err = os.Chmod(dir, 0o755) // QEMU's unprivileged uid opens the cache
		}
		if err != nil {
			agentErr = err
			return
		}
		CacheDir = filepath.Join(dir, "cache")
		StateDir = filepath.Join(dir, "state") // VM ids of tests repeat across test processes
		agentPath = filepath.Join(dir, "airlock-agent")
		build := exec.Command("go", "build", "-o", agentPath, "github.com/airlock-dev/airlock/cmd/airlock-agent")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("build agent: %v\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentPath
}

// run runs a shell command in the guest.
func run(t *testing.T, c *agent.Client, cmd string) (string, agent.ExitStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := c.Exec(ctx, agent.ExecRequest{Shell: cmd})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	out, errOut, _, st, err := p.Collect(ctx, 1<<20)
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return string(out) + string(errOut), st
}

// TestMicroVMEcho boots a guest and runs commands through its agent, as
// the policy's uid, on the guest's own kernel.
func TestMicroVMEcho(t *testing.T) {
	if err := (Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	bin := agentBinary(t)
	k, err := kernelPath()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Initramfs(k, bin); err != nil { // built once per cache, not timed below
		t.Fatal(err)
	}
	if _, err := chooseAccel(); err != nil { // the once-per-process KVM probe, not timed below
		t.Fatal(err)
	}
	if _, err := UsrImage(); err != nil { // built once per cache, not timed below
		t.Fatal(err)
	}
	start := time.Now()
	vm, c := bootGuest(t)
	if out, _ := run(t, c, "echo hi"); out != "hi\n" {
		t.Fatalf("echo hi: %q", out)
	}
	t.Logf("boot to first exec (echo hi): %s", time.Since(start).Round(time.Millisecond))
	// QEMU holds no privilege on the host and runs under its seccomp
	// filter (-sandbox).
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", vm.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st), "\nSeccomp:\t2\n") {
		t.Fatalf("QEMU is not under a seccomp filter:\n%s", st)
	}
	for _, l := range strings.Split(string(st), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 5 && (f[0] == "Uid:" || f[0] == "Gid:") && (f[1] == "0" || f[2] == "0" || f[3] == "0"):
			t.Fatalf("QEMU runs with id 0: %s", l)
		case len(f) == 2 && (f[0] == "CapEff:" || f[0] == "CapPrm:") && f[1] != "0000000000000000":
			t.Fatalf("QEMU has capabilities: %s", l)
		}
	}
	if out, _ := run(t, c, "id -u; cat /proc/1/cmdline | tr '\\0' ' '"); !strings.HasPrefix(out, "1000\n/.airlock/airlock __agent") {
		t.Fatalf("identity: %q", out)
	}
	if out, _ := run(t, c, "python3 -c 'import sys, json, sqlite3, ssl; print(6*7, sys.version_info[0])'"); out != "42 3\n" {
		t.Fatalf("python3: %q", out)
	}
	// The guest's kernel is not the host's.
	var u unix.Utsname
	unix.Uname(&u)
	host := unix.ByteSliceToString(u.Release[:])
	if out, _ := run(t, c, "uname -r"); strings.TrimSpace(out) == host {
		t.Fatalf("guest kernel %q is the host's", out)
	}
}

// TestMicroVMGuestCrashEndsOnlyItsVM: what the workload can do to its
// guest kernel ends only its own VM. A uid-1000 workload can neither
// reboot the guest, trigger sysrq nor signal the agent (PID 1); a root
// workload can panic the guest kernel (sysrq c), which ends that QEMU and
// nothing else: another guest goes on answering, and the host's cgroup of
// the crashed VM is removed by Destroy.
func TestMicroVMGuestCrashEndsOnlyItsVM(t *testing.T) {
	victim, vc := bootGuest(t, "--user", "0:0", "--root-caps="+native.RootCapsArg())
	other, oc := bootGuest(t)

	out, _ := run(t, oc, "reboot -f; echo b > /proc/sysrq-trigger; kill -9 1; echo alive")
	if !strings.Contains(out, "alive\n") || !strings.Contains(out, "reboot: (null): Operation not permitted") ||
		!strings.Contains(out, "can't create /proc/sysrq-trigger: Permission denied") || !strings.Contains(out, "can't kill pid 1: Operation not permitted") {
		t.Fatalf("uid 1000 hostile commands: %q", out)
	}
	if out, _ := run(t, oc, "echo hi"); out != "hi\n" {
		t.Fatalf("after uid-1000 attempts: %q", out)
	}

	if out, _ := run(t, vc, "id -u"); out != "0\n" {
		t.Fatalf("root workload: id -u %q", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	p, err := vc.Exec(ctx, agent.ExecRequest{Shell: "echo c > /proc/sysrq-trigger"})
	cancel()
	if err == nil {
		go p.Collect(context.Background(), 1<<10) // the connection ends with the guest
	} else if !strings.Contains(err.Error(), "closed") && !strings.Contains(err.Error(), "EOF") {
		// Not the end of the connection with the guest: the write never ran.
		t.Fatalf("exec of the panic: %v", err)
	}
	select {
	case <-victim.Done():
	case <-time.After(5 * time.Minute):
		t.Fatal("the guest whose kernel panicked is still running")
	}
	// It ended through pvpanic (QEMU's panic action: exit 1), not through
	// a reset that may never come.
	var ee *exec.ExitError
	if !errors.As(victim.waitErr, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("QEMU of the panicked guest ended with %v, not its panic action (exit status 1)", victim.waitErr)
	}
	select {
	case <-other.Done():
		t.Fatal("the other guest ended with the crashed one")
	default:
	}
	if out, _ := run(t, oc, "echo still here"); out != "still here\n" {
		t.Fatalf("other guest after the crash: %q", out)
	}
	cg := victim.group
	if err := victim.Destroy(); err != nil {
		t.Fatal(err)
	}
	if cg != nil {
		for _, d := range cg.Dirs() {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				t.Fatalf("crashed VM's cgroup %s left behind (%v)", d, err)
			}
		}
	}
}

// TestMicroVMBootFailureLeavesNothing: a guest whose agent never gets
// ready (here an "agent" that exits at once, so the guest's init ends and
// its kernel panics) fails the start with the reason, and leaves neither
// QEMU nor its cgroup behind.
func TestMicroVMBootFailureLeavesNothing(t *testing.T) {
	if err := (Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	agentBinary(t) // the cache directory
	dir := t.TempDir()
	bad := filepath.Join(dir, "agent")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho fake agent exits >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := testPolicy(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	stdin := os.NewFile(uintptr(fds[1]), "agent")
	defer stdin.Close()
	logf, err := os.Create(filepath.Join(dir, "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	id := "mvt-fail-" + filepath.Base(dir)
	inst, _, err := Tier{}.Start(native.Config{ID: id, Policy: p, Args: []string{native.AgentPath, "__agent"},
		Stdin: stdin, Stdout: logf, Stderr: logf, Agent: true, AgentBinary: bad})
	if err == nil {
		inst.Destroy()
		t.Fatal("a guest whose agent exits at once started")
	}
	if !strings.Contains(err.Error(), "boot") {
		t.Fatalf("error does not say the boot failed: %v", err)
	}
	console, _ := os.ReadFile(logf.Name())
	if !strings.Contains(string(console), "fake agent exits") {
		t.Fatalf("the guest's console is not in the log: %q", console)
	}
	if g, err := cgroups.Lookup(id); err == nil && g != nil {
		for _, d := range g.Dirs() {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				t.Fatalf("cgroup %s left behind (%v)", d, err)
			}
		}
	}
	out, _ := exec.Command("pgrep", "-f", id).Output()
	if len(out) > 0 {
		t.Fatalf("processes of %s left: %s", id, out)
	}
}
