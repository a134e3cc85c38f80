//go:build linux && amd64

package seccomp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/internal/probe/probebuild"
)

// childProfileEnv makes the test binary act as a launcher: install the
// filter of the named profile ("none" for no filter) and execve the program
// named by the remaining arguments.
const childProfileEnv = "AIRLOCK_SECCOMP_TEST_PROFILE"

func TestMain(m *testing.M) {
	if profile, ok := os.LookupEnv(childProfileEnv); ok {
		os.Exit(launch(profile, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// launch installs the filter and replaces the process with argv; it
// returns only on failure, with an exit code that names the failing step.
func launch(profile string, argv []string) int {
	runtime.LockOSThread()
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "launcher: no program to run")
		return 120
	}
	if profile != "none" {
		f, err := Build(profile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "launcher:", err)
			return 121
		}
		if err := f.Install(); err != nil {
			fmt.Fprintln(os.Stderr, "launcher:", err)
			return 122
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, childProfileEnv+"=") {
			env = append(env, kv)
		}
	}
	err := syscall.Exec(argv[0], argv, env)
	fmt.Fprintf(os.Stderr, "launcher: exec %s: %v\n", argv[0], err)
	return 123
}

// probeRun is the outcome of one probe process.
type probeRun struct {
	stdout string
	state  *os.ProcessState
}

// signaled reports the signal that killed the probe, or 0.
func (r probeRun) signaled() syscall.Signal {
	ws, ok := r.state.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return 0
	}
	return ws.Signal()
}

// runProbe runs the probe under a profile ("none": no filter) with stdin
// on /dev/null and returns what it printed and how it ended.
func runProbe(t *testing.T, profile, probe string, args ...string) probeRun {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, append([]string{probe}, args...)...)
	// The probe's ptrace check attaches to a child of its own, never to
	// whatever pid 1 is where the tests run.
	cmd.Env = append(os.Environ(), childProfileEnv+"="+profile, "AIRLOCK_PROBE_PTRACE_PID=0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start probe: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("probe %v under %s hung; stderr:\n%s", args, profile, stderr.String())
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("probe %v under %s: %v", args, profile, err)
	}
	if code := cmd.ProcessState.ExitCode(); code >= 120 && code <= 123 {
		t.Fatalf("launcher failed (exit %d): %s", code, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Logf("probe %v under %s, stderr:\n%s", args, profile, stderr.String())
	}
	return probeRun{stdout: stdout.String(), state: cmd.ProcessState}
}

// probeVerdicts runs the probe's checks under a profile and decodes them.
func probeVerdicts(t *testing.T, profile string) map[string]string {
	t.Helper()
	run := runProbe(t, profile, probebuild.Build(t))
	if !run.state.Success() {
		t.Fatalf("probe under %s ended with %v; output:\n%s", profile, run.state, run.stdout)
	}
	var v map[string]string
	if err := json.Unmarshal([]byte(run.stdout), &v); err != nil {
		t.Fatalf("probe under %s printed no JSON object: %v\n%s", profile, err, run.stdout)
	}
	return v
}

// strictExpect is what every check must report under the strict filter.
var strictExpect = map[string]string{
	"io_uring_setup":     "denied:EPERM",
	"bpf":                "denied:EPERM",
	"userfaultfd":        "denied:EPERM",
	"perf_event_open":    "denied:EPERM",
	"keyctl":             "denied:EPERM",
	"add_key":            "denied:EPERM",
	"request_key":        "denied:EPERM",
	"unshare_user":       "denied:EPERM",
	"unshare_ns":         "denied:EPERM",
	"clone3":             "denied:ENOSYS",
	"clone_newns":        "denied:EPERM",
	"clone_newuser":      "denied:EPERM",
	"clone_plain":        "allowed",
	"mount":              "denied:EPERM",
	"umount2":            "denied:EPERM",
	"pivot_root":         "denied:EPERM",
	"chroot":             "denied:EPERM",
	"ptrace_attach_1":    "denied:EPERM",
	"process_vm_readv":   "denied:EPERM",
	"process_vm_writev":  "denied:EPERM",
	"kcmp":               "denied:EPERM",
	"pidfd_getfd":        "denied:EPERM",
	"setns":              "denied:EPERM",
	"open_by_handle_at":  "denied:EPERM",
	"name_to_handle_at":  "denied:EPERM",
	"settimeofday":       "denied:EPERM",
	"clock_settime":      "denied:EPERM",
	"kexec_load":         "denied:EPERM",
	"init_module":        "denied:EPERM",
	"acct":               "denied:EPERM",
	"swapon":             "denied:EPERM",
	"syslog":             "denied:EPERM",
	"reboot":             "denied:EPERM",
	"iopl":               "denied:EPERM",
	"personality_bad":    "denied:EPERM",
	"personality_query":  "allowed",
	"socket_alg":         "denied:EAFNOSUPPORT",
	"socket_packet":      "denied:EAFNOSUPPORT",
	"socket_netlink":     "denied:EAFNOSUPPORT",
	"socket_vsock":       "denied:EAFNOSUPPORT",
	"socket_inet":        "allowed",
	"socket_unix":        "allowed",
	"socketpair_unix":    "allowed",
	"ioctl_tiocsti":      "denied:EPERM",
	"ioctl_tiocsti_high": "denied:EPERM",
	"ioctl_tioclinux":    "denied:EPERM",
	// stdin is /dev/null: an allowed terminal ioctl fails with ENOTTY.
	"ioctl_tcgets":  "ENOTTY",
	"fsopen":        "denied:ENOSYS",
	"fspick":        "denied:ENOSYS",
	"fsmount":       "denied:ENOSYS",
	"fsconfig":      "denied:ENOSYS",
	"open_tree":     "denied:ENOSYS",
	"move_mount":    "denied:ENOSYS",
	"mount_setattr": "denied:ENOSYS",
	"exec_child":    "allowed",
	"seccomp_mode":  "2",
	"no_new_privs":  "1",
}

// lightExpect lists where the light profile differs from strict; the value
// is what light must not report ("" means the check must be "allowed").
var lightExpect = map[string]string{
	"ptrace_attach_1":   "",
	"process_vm_readv":  "",
	"process_vm_writev": "",
	"personality_bad":   "",
	"socket_netlink":    "",
	// kcmp needs CONFIG_KCMP; without it the kernel says ENOSYS.
	"kcmp": "denied:EPERM",
}

func logVerdicts(t *testing.T, title string, v map[string]string) {
	t.Helper()
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-20s %s\n", k, v[k])
	}
	t.Logf("%s:\n%s", title, b.String())
}

func TestProbeUnderFilter(t *testing.T) {
	for _, profile := range []string{ProfileStrict, ProfileStandard} {
		t.Run(profile, func(t *testing.T) {
			got := probeVerdicts(t, profile)
			for check, want := range strictExpect {
				if got[check] != want {
					t.Errorf("%s: got %q, want %q", check, got[check], want)
				}
			}
			if t.Failed() {
				logVerdicts(t, profile, got)
			}
		})
	}
}

func TestProbeLightProfile(t *testing.T) {
	got := probeVerdicts(t, ProfileLight)
	for check, strictVerdict := range strictExpect {
		notWant, differs := lightExpect[check]
		switch {
		case !differs:
			if got[check] != strictVerdict {
				t.Errorf("%s: got %q under light, want %q as in strict", check, got[check], strictVerdict)
			}
		case notWant == "":
			if got[check] != "allowed" {
				t.Errorf("%s: got %q under light, want allowed", check, got[check])
			}
		default:
			if got[check] == notWant {
				t.Errorf("%s: got %q under light, which only strict may return", check, got[check])
			}
		}
	}
	if t.Failed() {
		logVerdicts(t, ProfileLight, got)
	}
}

// TestProbeWithoutFilter is the control: the same probe with no filter must
// get different answers for many checks, so the filter tests above cannot
// pass against an empty or broken filter.
func TestProbeWithoutFilter(t *testing.T) {
	got := probeVerdicts(t, "none")
	logVerdicts(t, "no filter", got)
	if got["seccomp_mode"] != "0" {
		t.Skipf("the test process already runs under seccomp (mode %s): no clean control", got["seccomp_mode"])
	}
	var differ []string
	for check, want := range strictExpect {
		if strings.HasPrefix(want, "denied:") && got[check] != want {
			differ = append(differ, check)
		}
	}
	sort.Strings(differ)
	t.Logf("%d checks that the filter denies are not denied the same way without it: %v", len(differ), differ)
	if len(differ) < 10 {
		t.Errorf("only %d denied checks behave differently without the filter; the probe cannot tell the filter's work from the host's", len(differ))
	}
	// clone3 exists on every supported kernel: a NULL argument is EINVAL
	// (or EFAULT), never ENOSYS.
	if got["clone3"] == "denied:ENOSYS" {
		t.Errorf("clone3 without filter: got %q", got["clone3"])
	}
	for _, check := range []string{"socket_inet", "socket_unix", "clone_plain", "exec_child", "personality_query"} {
		if got[check] != "allowed" {
			t.Errorf("%s without filter: got %q, want allowed", check, got[check])
		}
	}
}

func TestForeignABIKilled(t *testing.T) {
	probe := probebuild.Build(t)
	t.Run("x32", func(t *testing.T) {
		control := runProbe(t, "none", probe, "x32")
		if !strings.HasPrefix(control.stdout, "alive") {
			t.Fatalf("x32 probe without filter: %v, output %q", control.state, control.stdout)
		}
		for _, profile := range []string{ProfileStrict, ProfileLight} {
			run := runProbe(t, profile, probe, "x32")
			if sig := run.signaled(); sig != syscall.SIGSYS {
				t.Errorf("x32 call under %s: ended with %v (output %q), want death by SIGSYS", profile, run.state, run.stdout)
			}
		}
	})
	t.Run("int80", func(t *testing.T) {
		control := runProbe(t, "none", probe, "int80")
		if strings.HasPrefix(control.stdout, "fault") {
			t.Skipf("this kernel has no 32-bit system call gate: %s", strings.TrimSpace(control.stdout))
		}
		if !strings.HasPrefix(control.stdout, "alive") {
			t.Fatalf("int80 probe without filter: %v, output %q", control.state, control.stdout)
		}
		for _, profile := range []string{ProfileStrict, ProfileLight} {
			run := runProbe(t, profile, probe, "int80")
			if sig := run.signaled(); sig != syscall.SIGSYS {
				t.Errorf("int $0x80 under %s: ended with %v (output %q), want death by SIGSYS", profile, run.state, run.stdout)
			}
		}
	})
}
