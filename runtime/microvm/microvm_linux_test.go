package microvm

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"airlock/agent"
	"airlock/policy"
	"airlock/runtime/native"
)

// bootGuest starts a guest with a freshly built agent and returns it with
// a client of its agent.
func bootGuest(t *testing.T) (*VM, *agent.Client) {
	t.Helper()
	if err := (Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "airlock-agent")
	build := exec.Command("go", "build", "-o", bin, "airlock/cmd/airlock-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build agent: %v\n%s", err, out)
	}
	CacheDir = filepath.Join(dir, "cache")
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
	inst, _, err := Tier{}.Start(native.Config{ID: "mvt-" + strings.ToLower(t.Name())[:8], Policy: p,
		Args: []string{native.AgentPath, "__agent", "--user", "1000:1000"}, Stdin: stdin, Stdout: logf, Stderr: logf,
		Agent: true, AgentBinary: bin})
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
	_, c := bootGuest(t)
	if out, _ := run(t, c, "echo hi"); out != "hi\n" {
		t.Fatalf("echo hi: %q", out)
	}
	if out, _ := run(t, c, "id -u; cat /proc/1/cmdline | tr '\\0' ' '"); !strings.HasPrefix(out, "1000\n/.airlock/airlock __agent") {
		t.Fatalf("identity: %q", out)
	}
	// The guest's kernel is not the host's.
	var u unix.Utsname
	unix.Uname(&u)
	host := unix.ByteSliceToString(u.Release[:])
	if out, _ := run(t, c, "uname -r"); strings.TrimSpace(out) == host {
		t.Fatalf("guest kernel %q is the host's", out)
	}
}
