package native_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

func strict(t testing.TB) policy.Policy {
	t.Helper()
	p, err := policy.Preset(policy.Strict)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// run runs argv in a strict sandbox (adjusted by mod) and returns the result.
func run(t testing.TB, mod func(*policy.Policy), argv ...string) *native.Result {
	t.Helper()
	p := strict(t)
	if mod != nil {
		mod(&p)
	}
	res, err := runIn(context.Background(), native.Config{Policy: p, Args: argv}, native.RunOptions{Capture: true})
	if err != nil {
		t.Fatalf("run %q: %v", argv, err)
	}
	return res
}

func sh(t testing.TB, mod func(*policy.Policy), script string) *native.Result {
	t.Helper()
	return run(t, mod, "/bin/sh", "-c", script)
}

func TestRunEcho(t *testing.T) {
	res := run(t, nil, "echo", "hello")
	if res.Status != native.StatusOK || res.Stdout != "hello\n" {
		t.Fatalf("got %+v", res)
	}
	res = sh(t, nil, "echo out; echo err >&2; exit 3")
	if res.Status != native.StatusNonzeroExit || res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" {
		t.Fatalf("got %+v", res)
	}
}

func TestPython(t *testing.T) {
	res := run(t, nil, "python3", "-c", "print(6*7)")
	if res.Status != native.StatusOK || res.Stdout != "42\n" {
		t.Fatalf("got %+v", res)
	}
}

func TestCommandNotFound(t *testing.T) {
	p := strict(t)
	_, err := runIn(context.Background(), native.Config{Policy: p, Args: []string{"no-such-command-xyz"}}, native.RunOptions{})
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("want not found, got %v", err)
	}
}

// TestOnlyOwnProcesses: a host process with a unique argument is invisible.
func TestOnlyOwnProcesses(t *testing.T) {
	marker := fmt.Sprintf("%d.4242", 100000+os.Getpid())
	host := exec.Command("sleep", marker)
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer host.Process.Kill()
	res := sh(t, nil, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; ls /proc | grep -c '^[0-9]'")
	if strings.Contains(res.Stdout, marker) {
		t.Fatalf("sandbox sees host process: %q", res.Stdout)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	n, _ := strconv.Atoi(lines[len(lines)-1])
	if n == 0 || n > 5 {
		t.Fatalf("sandbox sees %d processes: %q", n, res.Stdout)
	}
	// Signalling pid 1 of the host is impossible too: pid 1 inside is the sandbox itself.
	res = sh(t, nil, "kill -0 $(cat /proc/1/cmdline | tr '\\0' ' ' | cut -c1-20 >/dev/null; echo 1) && cat /proc/1/cmdline | tr '\\0' ' '")
	if !strings.Contains(res.Stdout, "/bin/sh") {
		t.Fatalf("pid 1 inside should be the sandbox's own program, got %q", res.Stdout)
	}
}

// TestHostFilesInvisible: secrets on the host cannot be read.
func TestHostFilesInvisible(t *testing.T) {
	secretDir := t.TempDir()
	secret := filepath.Join(secretDir, "secret")
	if err := os.WriteFile(secret, []byte("TOPSECRET-HOSTFILE"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := sh(t, nil, "cat /etc/shadow "+secret+" /root/.bashrc /run/airlock/* 2>&1; ls / /root 2>&1; grep -rs TOPSECRET /tmp /workspace /etc /run /dev/shm; echo done")
	if strings.Contains(res.Stdout, "TOPSECRET-HOSTFILE") || strings.Contains(res.Stdout, "root:") {
		t.Fatalf("host secret visible: %q", res.Stdout)
	}
	if !strings.Contains(res.Stdout, "No such file") {
		t.Fatalf("expected missing files, got %q", res.Stdout)
	}
}

// TestCannotWriteOutside: writes outside /workspace and /tmp fail, and the
// host sees nothing written.
func TestCannotWriteOutside(t *testing.T) {
	name := fmt.Sprintf("airlock-probe-%d", os.Getpid())
	targets := []string{"/" + name, "/usr/" + name, "/etc/" + name, "/usr/lib/" + name, "/dev/" + name, "/proc/" + name}
	var script strings.Builder
	for _, tg := range targets {
		fmt.Fprintf(&script, "if echo x > %s 2>/dev/null; then echo WROTE %s; fi; ", tg, tg)
	}
	script.WriteString("echo x > /workspace/ok && echo x > /tmp/ok && echo writable-ok")
	res := sh(t, nil, script.String())
	if strings.Contains(res.Stdout, "WROTE") || !strings.Contains(res.Stdout, "writable-ok") {
		t.Fatalf("got %q / %q", res.Stdout, res.Stderr)
	}
	for _, tg := range targets {
		if _, err := os.Stat(tg); err == nil {
			t.Fatalf("host file %s was created", tg)
		}
	}
}

// TestNoNetwork: the host's loopback services are unreachable.
func TestNoNetwork(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	res := run(t, nil, "python3", "-c", fmt.Sprintf(`
import socket
for host in ("127.0.0.1", "10.0.2.2", "8.8.8.8"):
    try:
        s = socket.create_connection((host, %d), timeout=1)
        print("CONNECTED", host)
    except OSError as e:
        print("refused", host, e.errno)
try:
    socket.getaddrinfo("example.com", 80)
    print("RESOLVED")
except OSError as e:
    print("noresolve")
`, port))
	if strings.Contains(res.Stdout, "CONNECTED") || strings.Contains(res.Stdout, "RESOLVED") {
		t.Fatalf("network reachable: %q", res.Stdout)
	}
	select {
	case <-accepted:
		t.Fatal("host listener accepted a connection from the sandbox")
	case <-time.After(100 * time.Millisecond):
	}
}

// hostStatus reads /proc/<pid>/status of a process as the host sees it.
func hostStatus(t *testing.T, pid int) map[string]string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		m[k] = strings.TrimSpace(v)
	}
	return m
}

// TestPrivilegesFromHost starts a sleeping sandbox and inspects it from the
// host: unprivileged uid, no capabilities, no_new_privs, seccomp, no fds but 0-2.
func TestPrivilegesFromHost(t *testing.T) {
	// A descriptor the launcher holds without close-on-exec must not leak.
	leak, err := syscall.Open("/etc/hostname", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(leak)
	os.Setenv("AIRLOCK_TEST_HOST_SECRET", "hunter2")
	defer os.Unsetenv("AIRLOCK_TEST_HOST_SECRET")

	p := strict(t)
	sb, err := native.Start(native.Config{Policy: p, Args: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	st := hostStatus(t, sb.Pid)
	uid := strings.Fields(st["Uid"])
	for _, u := range uid {
		if u == "0" {
			t.Fatalf("sandbox runs as host root: Uid %v", uid)
		}
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if st[k] != "0000000000000000" {
			t.Errorf("%s = %s, want 0", k, st[k])
		}
	}
	if adj, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", sb.Pid)); strings.TrimSpace(string(adj)) != strconv.Itoa(native.OOMScoreAdj) {
		t.Errorf("oom_score_adj = %q, want %d (sandboxes die first under host memory pressure)", adj, native.OOMScoreAdj)
	}
	if st["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs = %s", st["NoNewPrivs"])
	}
	if st["Seccomp"] != "2" {
		t.Errorf("Seccomp = %s", st["Seccomp"])
	}
	// The dynamic loader opens libraries transiently while the program
	// starts: a leaked descriptor is one that stays.
	var extra []string
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", sb.Pid))
		if err != nil {
			t.Fatal(err)
		}
		extra = extra[:0]
		for _, fd := range fds {
			if n, _ := strconv.Atoi(fd.Name()); n > 2 {
				l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", sb.Pid, fd.Name()))
				extra = append(extra, fd.Name()+" -> "+l)
			}
		}
		if len(extra) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(extra) > 0 {
		t.Errorf("sandbox holds descriptors beyond 0-2: %v", extra)
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", sb.Pid))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimRight(string(env), "\x00"), "\x00")
	if strings.Join(got, "\n") != strings.Join(p.Env, "\n") {
		t.Errorf("environment = %q, want exactly %q", got, p.Env)
	}
	// Different namespaces than the host for every kind.
	for _, ns := range []string{"user", "pid", "mnt", "net", "ipc", "uts", "cgroup"} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", sb.Pid, ns))
		if err != nil || mine == theirs {
			t.Errorf("namespace %s not separate: host %s sandbox %s (%v)", ns, mine, theirs, err)
		}
	}
}

// TestDoubleForkKilled: a process that double-forks and calls setsid is
// gone when the run ends.
func TestDoubleForkKilled(t *testing.T) {
	marker := fmt.Sprintf("%d.777", 200000+os.Getpid())
	res := sh(t, nil, "(setsid sleep "+marker+" &) ; (nohup sleep "+marker+" >/dev/null 2>&1 &); echo started")
	if !strings.Contains(res.Stdout, "started") {
		t.Fatalf("got %+v", res)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if !hostHasProcess(marker) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a double-forked sandbox process survived the run")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func hostHasProcess(marker string) bool {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if strings.Contains(string(b), marker) {
			return true
		}
	}
	return false
}

func TestTimeout(t *testing.T) {
	marker := fmt.Sprintf("%d.555", 300000+os.Getpid())
	res := sh(t, func(p *policy.Policy) { p.Limits.WallTime = 300 * time.Millisecond },
		"(setsid sleep "+marker+" &); sleep "+marker)
	if res.Status != native.StatusTimeout {
		t.Fatalf("status %s, want timeout", res.Status)
	}
	time.Sleep(50 * time.Millisecond)
	if hostHasProcess(marker) {
		t.Fatal("process survived the timeout")
	}
}

// TestLauncherBinaryNotWritable: no exe visible inside can be opened for
// writing, including the airlock binary bound for the agent.
func TestLauncherBinaryNotWritable(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(self)
	p := strict(t)
	res, err := native.Run(context.Background(), native.Config{Policy: p, AgentBinary: self,
		Args: []string{"/bin/sh", "-c", `for f in /proc/*/exe ` + native.AgentPath + `; do if (echo x >> "$f") 2>/dev/null; then echo "WROTE $f"; fi; done; ls -l ` + native.AgentPath}},
		native.RunOptions{Capture: true})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Stdout, "WROTE") || !strings.Contains(res.Stdout, native.AgentPath) {
		t.Fatalf("got %q %q", res.Stdout, res.Stderr)
	}
	after, _ := os.ReadFile(self)
	if string(before) != string(after) {
		t.Fatal("launcher binary changed")
	}
}

func TestWorkspaceDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ws")
	res := sh(t, func(p *policy.Policy) { p.Filesystem.Workspace = dir }, "echo data > /workspace/out.txt && pwd")
	if res.Status != native.StatusOK || res.Stdout != "/workspace\n" {
		t.Fatalf("got %+v", res)
	}
	b, err := os.ReadFile(filepath.Join(dir, "out.txt"))
	if err != nil || string(b) != "data\n" {
		t.Fatalf("workspace file: %q %v", b, err)
	}
	// A root-owned existing directory is refused, not chowned.
	if os.Geteuid() == 0 {
		owned := t.TempDir()
		p := strict(t)
		p.Filesystem.Workspace = owned
		_, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"true"}}, native.RunOptions{})
		if err == nil || !strings.Contains(err.Error(), "owned by uid 0") {
			t.Fatalf("want ownership error, got %v", err)
		}
	}
}

func TestEnforcedReport(t *testing.T) {
	res := run(t, nil, "true")
	for _, name := range []string{"userns", "pidns", "mountns", "netns", "ipcns", "utsns", "cgroupns", "cgroup", "seccomp", "landlock", "capabilities", "no_new_privs", "rlimits"} {
		l, ok := res.Enforced.Get(name)
		if !ok || l.State != "ok" {
			t.Errorf("layer %s: %+v (present %v)", name, l, ok)
		}
	}
}

func BenchmarkColdStartTrue(b *testing.B) {
	p := strict(b)
	for i := 0; i < b.N; i++ {
		res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/true"}}, native.RunOptions{})
		if err != nil || res.Status != native.StatusOK {
			b.Fatalf("%v %+v", err, res)
		}
	}
}
