package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/runtime/microvm"
)

// TestRunMicroVM: airlock run --runtime microvm runs the command in a
// guest with a kernel of its own, as the policy's uid, streams stdin,
// stdout and stderr, returns the command's exit code, honours the wall
// time, runs code cells, and labels the result with the vm layer and its
// accelerator.
func TestRunMicroVM(t *testing.T) {
	if err := (microvm.Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	var u unix.Utsname
	unix.Uname(&u)
	host := unix.ByteSliceToString(u.Release[:])

	cmd := exec.Command(airlockBin(t), "run", "--runtime", "microvm", "--microvm-accel", "tcg", "--",
		"sh", "-c", "uname -r; id -u; wc -l; echo to-stderr >&2; exit 3")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}
	cmd.Stdin = strings.NewReader("one\ntwo\n")
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 3 {
		t.Fatalf("want exit 3, got %v; out %q err %q", err, o.String(), e.String())
	}
	lines := strings.Split(o.String(), "\n")
	if len(lines) < 3 || lines[0] == host || lines[0] == "" || lines[1] != "1000" || strings.TrimSpace(lines[2]) != "2" || !strings.Contains(e.String(), "to-stderr") {
		t.Fatalf("out %q err %q (host kernel %s)", o.String(), e.String(), host)
	}

	out, errOut, code := runCLI(t, nil, "run", "--runtime", "microvm", "--microvm-accel", "tcg", "--json", "--", "python3", "-c", "print(6*7)")
	var res struct {
		Status, Stdout string
		Enforced       []struct{ Name, State, Detail string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 {
		t.Fatalf("--json: code %d %v: %q %q", code, err, out, errOut)
	}
	if res.Status != "ok" || res.Stdout != "42\n" || len(res.Enforced) == 0 || res.Enforced[0].Name != "vm" ||
		!strings.Contains(res.Enforced[0].Detail, "TCG emulation") {
		t.Fatalf("--json result: %+v", res)
	}

	out, errOut, code = runCLI(t, nil, "run", "--runtime", "microvm", "--microvm-accel", "tcg", "--code", "import os\nx = 6*7\nprint(os.getuid())\nx")
	if code != 0 || out != "1000\n42\n" {
		t.Fatalf("code cell: code %d out %q err %q", code, out, errOut)
	}

	_, errOut, code = runCLI(t, nil, "run", "--runtime", "microvm", "--microvm-accel", "tcg", "--timeout", "3s", "--", "sleep", "1000")
	if code != exitTimeout || !strings.Contains(errOut, "timeout") {
		t.Fatalf("wall time: code %d err %q", code, errOut)
	}

	_, errOut, code = runCLI(t, nil, "run", "--runtime", "microvm", "--microvm-accel", "hvf", "--", "true")
	if code != exitUsage || !strings.Contains(errOut, `unknown "hvf"`) {
		t.Fatalf("bad accel: code %d err %q", code, errOut)
	}
}

// TestDoctorMicroVM: airlock doctor reports the microvm tier, with the
// accelerator it would use and why.
func TestDoctorMicroVM(t *testing.T) {
	if err := (microvm.Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	out, errOut, _ := runCLI(t, nil, "doctor", "--json", "--microvm-accel", "tcg")
	var res struct {
		Layers []struct{ Name, State, Detail string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("doctor --json: %v: %q %q", err, out, errOut)
	}
	for _, l := range res.Layers {
		if l.Name == "microvm" {
			if l.State != "degraded" || !strings.Contains(l.Detail, "TCG emulation: chosen by --microvm-accel=tcg") || !strings.Contains(l.Detail, "kernel /boot/") || !strings.Contains(l.Detail, "initramfs") {
				t.Fatalf("microvm layer: %+v", l)
			}
			return
		}
	}
	t.Fatalf("doctor does not report the microvm tier: %q", out)
}

// TestRunMicroVMNet: airlock run --runtime microvm --net reaches an
// allowlisted host through the run's egress proxy (over the guest's
// virtio-serial egress port: the guest has no network device), with the
// --secret header injected on the host, and is refused another host.
func TestRunMicroVMNet(t *testing.T) {
	if err := (microvm.Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	got := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.Host + " " + r.Header.Get("Authorization"):
		default:
		}
		fmt.Fprint(w, "hello from the API")
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	script := fmt.Sprintf(`import urllib.request
print(urllib.request.urlopen('http://api.test:%[1]d/').read().decode())
try:
    urllib.request.urlopen('http://denied.test:%[1]d/', timeout=60)
    print('denied.test reached')
except Exception as e:
    print('denied.test refused:', e)
`, port)
	cmd := exec.Command(airlockBin(t), "run", "--runtime", "microvm", "--microvm-accel", "tcg",
		"--net", fmt.Sprintf("allow:api.test:%d", port), "--net", "allow:127.0.0.1", // the test's server is on the loopback
		"--resolve", "api.test=127.0.0.1", "--resolve", "denied.test=127.0.0.1",
		"--secret", fmt.Sprintf("api.test:%d:Authorization:env:API_KEY", port), "--", "python3", "-c", script)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp", "API_KEY=Bearer sk-test-123"}
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil || !strings.Contains(o.String(), "hello from the API") || !strings.Contains(o.String(), "denied.test refused") {
		t.Fatalf("%v: out %q err %q", err, o.String(), e.String())
	}
	if r := <-got; r != fmt.Sprintf("api.test:%d Bearer sk-test-123", port) { // seen by the server, on the host
		t.Fatalf("the API saw %q", r)
	}
	select {
	case r := <-got:
		t.Fatalf("a refused request reached the server: %q", r)
	default:
	}
	if !strings.Contains(e.String(), "denied.test") {
		t.Fatalf("the refusal is not reported: %q", e.String())
	}
}

// TestRunMicroVMTTY: airlock run -it --runtime microvm gives the command a
// terminal of the guest's (the agent's PTY): the caller's terminal goes
// raw while it runs and is restored after, the guest's shell sees the
// caller's size and follows a resize, Ctrl-C interrupts its foreground
// command (airlock itself survives), and `exit 3` makes airlock exit 3.
func TestRunMicroVMTTY(t *testing.T) {
	if err := (microvm.Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	term := startOnTerminal(t, "run", "-it", "--runtime", "microvm", "--microvm-accel", "tcg", "--", "sh", "-i")
	out, ptmx, done := &term.out, term.ptmx, term.done
	type_ := func(s string) { t.Helper(); term.type_(t, s) }
	lflag := func() uint32 { t.Helper(); return term.lflag(t) }
	type_("echo hi-$((40+2)); stty size\n")
	// The guest boots first (TCG, a loaded host): wait longer than WaitFor.
	for deadline := time.Now().Add(5 * time.Minute); !strings.Contains(out.String(), "hi-42"); time.Sleep(100 * time.Millisecond) {
		select {
		case err := <-done:
			time.Sleep(100 * time.Millisecond) // the last output
			t.Fatalf("airlock run -t ended (%v) before the guest's shell answered; output:\n%q", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer from the guest's shell; output:\n%q", out.String())
		}
	}
	at := out.WaitFor(t, 0, "30 90")
	if l := lflag(); l&(unix.ICANON|unix.ECHO|unix.ISIG) != 0 {
		t.Errorf("the caller's terminal is not raw while the shell runs (lflag %#x)", l)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: 120, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String()[at:], "40 120") {
		if time.Now().After(deadline) {
			t.Fatalf("the resize never reached the guest; output:\n%q", out.String())
		}
		type_("stty size\n")
		time.Sleep(500 * time.Millisecond)
	}
	at = out.WaitFor(t, at, "40 120")
	// Ctrl-C ends the foreground sleep: the shell answers again.
	type_("sleep 4711\n")
	time.Sleep(2 * time.Second)
	type_("\x03")
	type_("echo back-$((2+3))\n")
	out.WaitFor(t, at, "back-5")
	type_("exit 3\n")
	select {
	case err := <-done:
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 3 {
			t.Fatalf("airlock run -t after `exit 3`: %v, want exit status 3; output:\n%q", err, out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("airlock run -t did not exit; output:\n%q", out.String())
	}
	if l := lflag(); l&(unix.ICANON|unix.ECHO|unix.ISIG) != unix.ICANON|unix.ECHO|unix.ISIG {
		t.Errorf("the caller's terminal was not restored (lflag %#x)", l)
	}
}
