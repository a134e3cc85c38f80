package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/internal/testserver"
)

// airlockBin builds the CLI once per test binary.
func airlockBin(t *testing.T) string { return testserver.Binary(t) }

func runCLI(t *testing.T, cred *syscall.Credential, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(airlockBin(t), args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestRunPythonRoot(t *testing.T) {
	out, errOut, code := runCLI(t, nil, "run", "--", "python3", "-c", "print(1)")
	if code != 0 || out != "1\n" || errOut != "" {
		t.Fatalf("code %d out %q err %q", code, out, errOut)
	}
}

// TestRunPythonUnprivileged: an ordinary user gets a sandbox through
// unprivileged user namespaces; on a cgroup v1 host limits degrade loudly.
func TestRunPythonUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to an unprivileged user")
	}
	out, errOut, code := runCLI(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "run", "--", "python3", "-c", "print(1)")
	if code != 0 || out != "1\n" {
		t.Fatalf("code %d out %q err %q", code, out, errOut)
	}
	out, _, code = runCLI(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "run", "--json", "--", "id", "-u")
	var res struct {
		Status   string
		Stdout   string
		Enforced []struct{ Name, State string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 || res.Stdout != "1000\n" {
		t.Fatalf("code %d %q %v", code, out, err)
	}
	for _, l := range res.Enforced {
		if l.Name == "cgroup" && l.State != "ok" && !strings.Contains(errOut, "WARNING") {
			t.Fatalf("cgroup %s but no warning printed: %q", l.State, errOut)
		}
	}
}

// TestBadInput: every kind of bad input gets one line on stderr, a distinct
// exit code, and never a Go panic.
func TestBadInput(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown flag", []string{"run", "--bogus", "--", "true"}, exitUsage, "flag provided but not defined"},
		{"missing command", []string{"run"}, exitUsage, "missing command"},
		{"bad size", []string{"run", "--memory", "12xb", "--", "true"}, exitUsage, "bad size"},
		{"bad timeout", []string{"run", "--timeout", "soon", "--", "true"}, exitUsage, "bad duration"},
		{"missing mount source", []string{"run", "--mount", "/no/such/dir:/data", "--", "true"}, exitUsage, "source does not exist"},
		{"bad mount target", []string{"run", "--mount", "/tmp:/proc", "--", "true"}, exitUsage, "cannot be replaced"},
		{"bad profile", []string{"run", "--profile", "yolo", "--", "true"}, exitUsage, "unknown profile"},
		{"command not found", []string{"run", "--", "no-such-command"}, exitNotFound, "not found"},
		{"not executable", []string{"run", "--", "/etc/passwd"}, exitNotExec, "not executable"},
		{"unknown command", []string{"fly"}, exitUsage, "unknown command"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errOut, code := runCLI(t, nil, c.args...)
			if code != c.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, c.code, errOut)
			}
			if !strings.Contains(errOut, c.want) {
				t.Errorf("stderr %q does not say %q", errOut, c.want)
			}
			if strings.Contains(errOut, "panic") || strings.Contains(errOut, "goroutine") {
				t.Errorf("Go panic: %q", errOut)
			}
			if c.name != "unknown command" && strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
				t.Errorf("want one line, got %q", errOut)
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	if _, _, code := runCLI(t, nil, "run", "--", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exit code %d, want 7", code)
	}
	if _, _, code := runCLI(t, nil, "run", "--timeout", "200ms", "--", "sleep", "5"); code != exitTimeout {
		t.Errorf("timeout exit code %d, want %d", code, exitTimeout)
	}
	out, _, code := runCLI(t, nil, "run", "--json", "--timeout", "200ms", "--", "sleep", "5")
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil || res["status"] != "timeout" || code != exitTimeout {
		t.Errorf("json %q code %d err %v", out, code, err)
	}
	for _, k := range []string{"status", "exit_code", "signal", "stdout", "stderr", "truncated", "wall_ms", "cpu_ms", "peak_memory_bytes", "enforced"} {
		if _, ok := res[k]; !ok {
			t.Errorf("json result lacks %q", k)
		}
	}
}

func TestDoctor(t *testing.T) {
	out, errOut, code := runCLI(t, nil, "doctor")
	for _, l := range []string{"cgroup", "cgroup-join", "userns", "pidns", "netns", "seccomp", "landlock", "runsc"} {
		if !strings.Contains(out, l) {
			t.Errorf("doctor output lacks %s: %q", l, out)
		}
	}
	if code != 0 {
		t.Errorf("doctor exit %d on a host that supports strict: %q %q", code, out, errOut)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}

// TestRunNetUnprivileged: the egress proxy works for an ordinary user (the
// listeners are opened inside the sandbox and passed out; no root needed).
func TestRunNetUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to an unprivileged user")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from the host") }))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	url := fmt.Sprintf("http://web.test:%d/", port)
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	out, errOut, code := runCLI(t, nobody, "run", "--net", "allow:web.test", "--net", "allow:127.0.0.1",
		"--resolve", "web.test=127.0.0.1", "--", "curl", "-s", url)
	if code != 0 || out != "hello from the host" {
		t.Fatalf("allowed: code %d out %q err %q", code, out, errOut)
	}
	out, _, _ = runCLI(t, nobody, "run", "--net", "allow:other.test", "--resolve", "web.test=127.0.0.1", "--", "curl", "-s", url)
	if strings.Contains(out, "hello from the host") {
		t.Fatalf("a name outside the allowlist was reached: %q", out)
	}
}

// TestSandboxIdentity: inside the sandbox $USER and $LOGNAME name the
// sandbox user, and /etc/os-release is the host's (programs such as pip and
// platform.freedesktop_os_release read it).
func TestSandboxIdentity(t *testing.T) {
	out, errOut, code := runCLI(t, nil, "run", "--", "sh", "-c", `echo "user=$USER logname=$LOGNAME"; cat /etc/os-release`)
	if code != 0 {
		t.Fatalf("code %d err %q", code, errOut)
	}
	if !strings.HasPrefix(out, "user=user logname=user\n") {
		t.Errorf("USER/LOGNAME: %q", out)
	}
	host, err := os.ReadFile("/etc/os-release")
	if err != nil {
		t.Skipf("the host has no /etc/os-release: %v", err)
	}
	if got := strings.SplitN(out, "\n", 2)[1]; got != string(host) {
		t.Errorf("/etc/os-release inside %q, host's %q", got, host)
	}
}

// TestDockerFlags: the spellings of Docker and bwrap users work (-e, -v,
// -w, -i, --rm), and -t/-it get an error that names the missing PTY.
func TestDockerFlags(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/f", []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, nil, "run", "--rm", "-i", "-e", "A=1", "-w", "/tmp", "-v", dir+":/data:ro", "--",
		"sh", "-c", `echo "A=$A"; pwd; cat /data/f`)
	if code != 0 || out != "A=1\n/tmp\nfrom the host\n" {
		t.Fatalf("code %d out %q err %q", code, out, errOut)
	}
	for _, flag := range []string{"-t", "-it", "-ti"} {
		_, errOut, code := runCLI(t, nil, "run", flag, "--", "true")
		if code != exitUsage || !strings.Contains(errOut, "pseudo-terminal") || strings.Contains(errOut, "not defined") {
			t.Errorf("%s: code %d err %q", flag, code, errOut)
		}
	}
}

// TestHelp: every command's --help exits 0 with its usage on stdout, run's
// shows each limit's default per profile, and serve's size flags take
// sizes.
func TestHelp(t *testing.T) {
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"run", "--help"}, []string{"usage:", "--code", "strict 512M", "strict 1m", "strict 128", "standard 2G", "@FILE"}},
		{[]string{"mcp", "--help"}, []string{"usage: airlock mcp", "strict 512M", "strict 128"}},
		{[]string{"doctor", "--help"}, []string{"usage: airlock doctor"}},
		{[]string{"keys", "--help"}, []string{"airlock keys create"}},
		{[]string{"serve", "--max-file-bytes", "1G", "--help"}, []string{"usage: airlock serve", "max-file-bytes", "default 256M"}},
	}
	for _, c := range cases {
		out, errOut, code := runCLI(t, nil, c.args...)
		if code != 0 {
			t.Errorf("%v: exit %d, stderr %q", c.args, code, errOut)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: stdout lacks %q:\n%s", c.args, w, out)
			}
		}
	}
	if _, errOut, code := runCLI(t, nil, "serve", "--max-file-bytes", "1X", "--help"); code != exitUsage || !strings.Contains(errOut, "bad size") {
		t.Errorf("--max-file-bytes 1X: exit %d, stderr %q", code, errOut)
	}
}

// TestKeysListCap: keys list says what a max_sandboxes of 0 means.
func TestKeysListCap(t *testing.T) {
	state := t.TempDir()
	if _, errOut, code := runCLI(t, nil, "keys", "create", "--name", "uncapped", "--state-dir", state); code != 0 {
		t.Fatalf("create: %d %q", code, errOut)
	}
	if _, errOut, code := runCLI(t, nil, "keys", "create", "--name", "capped", "--max-sandboxes", "3", "--state-dir", state); code != 0 {
		t.Fatalf("create: %d %q", code, errOut)
	}
	out, errOut, code := runCLI(t, nil, "keys", "list", "--state-dir", state)
	if code != 0 || !strings.Contains(out, "0 (no own cap: the server's --max-sandboxes)") || !regexp.MustCompile(`capped\s+\S+\s+3\s`).MatchString(out) {
		t.Fatalf("list: %d %q %q", code, out, errOut)
	}
}

// TestRunHostScript: the docs/network.md example, a script from the
// host's current directory run with a secret injected by the proxy:
// `airlock run -v ./call.py:/workspace/call.py --net allow:HOST --secret
// HOST:Authorization:env:API_KEY -- python3 call.py`.
func TestRunHostScript(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.Header.Get("Authorization"):
		default:
		}
		fmt.Fprint(w, "hello from the API")
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	script := fmt.Sprintf("import urllib.request\nprint(urllib.request.urlopen('http://api.test:%d/').read().decode())\n", port)
	if err := os.WriteFile(dir+"/call.py", []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(airlockBin(t), "run", "-v", "./call.py:/workspace/call.py",
		"--net", fmt.Sprintf("allow:api.test:%d", port), "--net", "allow:127.0.0.1", "--resolve", "api.test=127.0.0.1",
		"--secret", fmt.Sprintf("api.test:%d:Authorization:env:API_KEY", port), "--", "python3", "call.py")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp", "API_KEY=Bearer sk-test-123"}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hello from the API") {
		t.Fatalf("%v: %s", err, out)
	}
	if auth := <-got; auth != "Bearer sk-test-123" { // seen by the server, on the host
		t.Fatalf("Authorization %q", auth)
	}
}
