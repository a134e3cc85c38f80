package cgroup2vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// guestTimeout bounds one guest run: a boot under TCG and the suites at
// CI's load.
const guestTimeout = 9 * time.Minute

// needGuest skips when the host cannot boot a guest, saying what is
// missing (scripts/setup.sh installs it all).
func needGuest(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("cgroup v2 guest not available: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("the guest's /usr image is built in /var/cache/airlock (needs root)")
	}
}

var builds sync.Map // package -> *buildResult

type buildResult struct {
	once sync.Once
	path string
	err  error
}

// testBinary compiles the tests of pkg (go test -c) once per process.
func testBinary(t *testing.T, pkg string) string {
	t.Helper()
	return goBuild(t, "test", pkg)
}

// goBuild runs go test -c (verb "test") or go build (verb "build") of
// pkg once per process and returns the binary.
func goBuild(t *testing.T, verb, pkg string) string {
	t.Helper()
	b := prebuild(verb, pkg)
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path // removed by TestMain
}

// prebuild is goBuild without a test: safe to call from any goroutine.
func prebuild(verb, pkg string) *buildResult {
	v, _ := builds.LoadOrStore(verb+" "+pkg, &buildResult{})
	b := v.(*buildResult)
	b.once.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			//lint:ignore SA1019 a fallback when go is not on $PATH: the GOROOT this test binary was built with
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		dir, err := os.MkdirTemp("", "cgroup2vm-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, filepath.Base(pkg))
		args := []string{"build", "-o", b.path}
		if verb == "test" {
			b.path += ".test"
			args = []string{"test", "-c", "-o", b.path}
		}
		cmd := exec.Command(goTool, append(args, "github.com/airlock-dev/airlock/"+pkg)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = &buildError{pkg: pkg, out: string(out), err: err}
		}
	})
	return b
}

type buildError struct {
	pkg, out string
	err      error
}

func (e *buildError) Error() string {
	return "go test -c " + e.pkg + ": " + e.err.Error() + "\n" + e.out
}

func TestMain(m *testing.M) {
	code := m.Run()
	builds.Range(func(_, v any) bool {
		if b := v.(*buildResult); b.path != "" {
			os.RemoveAll(filepath.Dir(b.path))
		}
		return true
	})
	os.Exit(code)
}

// runGuest boots a guest with files and script and fails the test unless
// the script ran to its end.
func runGuest(t *testing.T, files map[string]string, script string) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guestTimeout)
	defer cancel()
	start := time.Now()
	cfg := Config{Files: files, Script: script}
	if testing.Verbose() {
		cfg.Output = os.Stderr
	}
	dir := t.TempDir()
	if keep := os.Getenv("CGROUP2VM_KEEP"); keep != "" {
		dir = keep // debugging: the initramfs stays there
	}
	res, err := Run(ctx, dir, cfg)
	if res != nil {
		t.Logf("guest console (%s):\n%s", time.Since(start).Round(time.Second), res.Console)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !res.Done {
		t.Fatalf("the guest's script did not run to its end (phases reported: %v)", res.Order)
	}
	return res
}

// The suites run in the guest: the cgroup package's (v2 detection,
// limits, OOM, pids, kill, delegation) and the native tier's limits and
// hostile tests that exercise cgroups (fork bomb, memory bomb, CPU quota,
// where a sandbox's init lands, no cgroupfs inside).
const (
	cgroupsTests = "TestDetect|TestCreateAppliesLimitsAndAccounts|TestMemoryLimitOOMKill|TestPidsLimitStopsForkLoop|TestKillForkBomb|TestDestroyEmptyAndChildGroups|TestCleanupStale|TestV2|TestFreezeThrottledGroup"
	nativeTests  = "TestStartJoinsCgroups|TestForkBomb|TestMemoryBomb|TestCPUQuota|TestNoWritableCgroupfs|TestRunEcho|TestAgentReserveV2"
)

// TestCgroupV2Guest boots one guest with only cgroup2 mounted and runs,
// as root, the cgroup package's and the native tier's cgroup suites; then
// the same as uid 1000 alone in a systemd-style delegated subtree
// (user@1000.service/app.scope, owned by uid 1000). Each phase is a
// subtest that fails when its suite failed in the guest. The guest's own
// layout is checked first: cgroup2 alone at /sys/fs/cgroup (no v1
// hierarchy), memory, pids and cpu enabled, python3 from the host's /usr,
// and a delegated subtree uid 1000 can use and not leave.
func TestCgroupV2Guest(t *testing.T) {
	needGuest(t)
	// Linked in parallel: each link of a large binary takes a while.
	var wg sync.WaitGroup
	for _, b := range [][2]string{{"test", "runtime/native/cgroups"}, {"test", "runtime/native"}, {"build", "cmd/airlock"}, {"build", "cmd/airlock-agent"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prebuild(b[0], b[1])
		}()
	}
	wg.Wait()
	files := map[string]string{
		"cgroups.test":  testBinary(t, "runtime/native/cgroups"),
		"native.test":   testBinary(t, "runtime/native"),
		"airlock":       goBuild(t, "build", "cmd/airlock"),
		"airlock-agent": goBuild(t, "build", "cmd/airlock-agent"),
	}
	script := `
phase layout sh -exc '
	test "$(grep -c " - cgroup " /proc/self/mountinfo)" = 0
	grep -q " /sys/fs/cgroup .* - cgroup2 " /proc/self/mountinfo
	for c in memory pids cpu; do grep -qw $c /sys/fs/cgroup/cgroup.subtree_control; done
	/usr/bin/python3 -c "import sys; print(\"python\", sys.version_info[0])"
	grep -q "^0::/phase-1$" /proc/self/cgroup
'
phase cgroups ./cgroups.test -test.v -test.count=1 -test.timeout=4m -test.run '` + cgroupsTests + `'
phase native env AIRLOCK_TEST_AGENT=/t/airlock-agent ./native.test -test.v -test.count=1 -test.timeout=4m -test.run '` + nativeTests + `'
phase doctor sh -c '/t/airlock doctor > /tmp/doctor.txt; cat /tmp/doctor.txt; grep -q "^cgroup  *ok  *cgroup v2 (memory,pids,cpu) at /sys/fs/cgroup/airlock$" /tmp/doctor.txt'
as_user delegated-layout sh -exc '
	test "$(id -u)" = 1000
	grep -q "^0::/user.slice/user-1000.slice/user@1000.service/app.scope$" /proc/self/cgroup
	mkdir /sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.scope/probe
	rmdir /sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.scope/probe
	! mkdir /sys/fs/cgroup/user.slice/escape 2>/dev/null
'
as_user delegated-cgroups /t/cgroups.test -test.v -test.count=1 -test.timeout=4m -test.run '` + cgroupsTests + `'
as_user delegated-native env AIRLOCK_TEST_AGENT=/t/airlock-agent /t/native.test -test.v -test.count=1 -test.timeout=4m -test.run '` + nativeTests + `'
as_user delegated-doctor /t/airlock doctor
as_user shared-delegation-doctor sh -c '/t/airlock doctor > /tmp/doctor-shared.txt; cat /tmp/doctor-shared.txt; grep -q "^cgroup  *missing .*processes other than airlock are in that cgroup (start airlock alone" /tmp/doctor-shared.txt'
phase undelegated-doctor sh -c 'exec su -s /bin/sh -c "/t/airlock doctor > /tmp/doctor-nodelegation.txt; cat /tmp/doctor-nodelegation.txt; grep -q \"^cgroup  *missing .*fix: run airlock as root (sudo), or give it a delegated cgroup v2 subtree\" /tmp/doctor-nodelegation.txt" -- user'
`
	phases := []string{"layout", "cgroups", "native", "doctor", "delegated-layout", "delegated-cgroups", "delegated-native", "delegated-doctor", "shared-delegation-doctor", "undelegated-doctor"}
	res := runGuest(t, files, script)
	for _, name := range phases {
		t.Run(name, func(t *testing.T) {
			rc, ok := res.Exits[name]
			switch {
			case !ok:
				t.Errorf("phase %s did not report", name)
			case rc != 0:
				t.Errorf("phase %s exited %d in the guest: %s", name, rc, failures(res.Console))
			}
		})
	}
	if !strings.Contains(res.Console, "python 3") {
		t.Errorf("python3 did not run in the guest")
	}
	// airlock doctor names the version and, as the delegated user, the
	// subtree it was given.
	for _, want := range []string{
		`(?m)^cgroup +ok +cgroup v2 \(memory,pids,cpu\) at /sys/fs/cgroup/airlock$`,
		`(?m)^cgroup +ok +cgroup v2 \(memory,pids,cpu\) in the delegated subtree /sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.scope, at /sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.scope/airlock$`,
	} {
		if !regexp.MustCompile(want).MatchString(res.Console) {
			t.Errorf("doctor printed no line matching %s", want)
		}
	}
}

// failures picks the lines of the guest's console that name failed tests.
func failures(console string) string {
	var out []string
	for _, l := range strings.Split(console, "\n") {
		if strings.Contains(l, "--- FAIL") || strings.HasPrefix(strings.TrimSpace(l), "+ ") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "; ")
}
