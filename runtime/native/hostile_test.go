package native_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/internal/probe/probebuild"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// probeIn runs the syscall probe inside a strict sandbox and returns its verdicts.
func probeIn(t *testing.T, profile policy.Profile, args ...string) (map[string]string, *native.Result) {
	t.Helper()
	bin := probebuild.Build(t)
	p, err := policy.Preset(profile)
	if err != nil {
		t.Fatal(err)
	}
	p.Filesystem.Mounts = append(p.Filesystem.Mounts, policy.Mount{Source: filepath.Dir(bin), Target: "/probe"})
	p.SetEnv("AIRLOCK_PROBE_PTRACE_PID", "1")
	res, err := runIn(context.Background(), native.Config{Policy: p, Args: append([]string{"/probe/" + filepath.Base(bin)}, args...)},
		native.RunOptions{Capture: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	if len(args) == 0 {
		if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
			t.Fatalf("probe output %q (stderr %q): %v", res.Stdout, res.Stderr, err)
		}
	}
	return got, res
}

// TestDeniedSyscalls: every dangerous call really returns its error inside
// a sandbox started by the launcher.
func TestDeniedSyscalls(t *testing.T) {
	got, _ := probeIn(t, policy.Strict)
	want := map[string]string{
		"io_uring_setup": "denied:EPERM", "bpf": "denied:EPERM", "userfaultfd": "denied:EPERM",
		"perf_event_open": "denied:EPERM", "keyctl": "denied:EPERM", "add_key": "denied:EPERM",
		"unshare_user": "denied:EPERM", "unshare_ns": "denied:EPERM", "clone3": "denied:ENOSYS",
		"clone_newns": "denied:EPERM", "mount": "denied:EPERM", "umount2": "denied:EPERM",
		"pivot_root": "denied:EPERM", "chroot": "denied:EPERM", "ptrace_attach_1": "denied:EPERM",
		"process_vm_readv": "denied:EPERM", "kcmp": "denied:EPERM", "pidfd_getfd": "denied:EPERM",
		"setns": "denied:EPERM", "open_by_handle_at": "denied:EPERM", "settimeofday": "denied:EPERM",
		"clock_settime": "denied:EPERM", "acct": "denied:EPERM", "swapon": "denied:EPERM",
		"syslog": "denied:EPERM", "personality_bad": "denied:EPERM",
		"socket_alg": "denied:EAFNOSUPPORT", "socket_packet": "denied:EAFNOSUPPORT",
		"socket_vsock": "denied:EAFNOSUPPORT", "socket_netlink": "denied:EAFNOSUPPORT",
		"ioctl_tiocsti": "denied:EPERM", "ioctl_tiocsti_high": "denied:EPERM", "ioctl_tioclinux": "denied:EPERM",
		"fsopen": "denied:ENOSYS", "open_tree": "denied:ENOSYS", "move_mount": "denied:ENOSYS",
		"socket_inet": "allowed", "seccomp_mode": "2", "no_new_privs": "1",
		"cap_eff": "0000000000000000", "cap_bnd": "0000000000000000", "cap_amb": "0000000000000000",
		"uid": "1000",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
}

// TestForeignABIKilled: an x32 system call kills the process (SIGSYS).
func TestForeignABIKilled(t *testing.T) {
	_, res := probeIn(t, policy.Strict, "x32")
	if res.Signal != "bad system call" {
		t.Fatalf("x32 call: status %s signal %q stdout %q, want death by SIGSYS", res.Status, res.Signal, res.Stdout)
	}
}

// startSB starts a sandbox running a shell script.
func startSB(t *testing.T, p policy.Policy, script string) testSandbox {
	t.Helper()
	sb, err := startIn(native.Config{Policy: p, Args: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy() })
	return sb
}

// TestForkBomb: the bomb stays under pids.max and the host still forks.
func TestForkBomb(t *testing.T) {
	p := strict(t)
	p.Limits.Pids = 32
	p.Limits.WallTime = 20 * time.Second
	// The classic bomb burns out (a shell exits when its fork fails), so
	// the loop after it keeps the group pressed against its limit with
	// processes that stay: a sample cannot miss the bomb on a slow machine.
	const hold = `import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        time.sleep(0.01)
`
	sb := startSB(t, p, "b() { b | b & }; b; exec /usr/bin/python3 -c '"+hold+"'")
	// The bomb must be seen forking (8 processes at least, else the test
	// proves nothing) and never above the limit while the host keeps
	// forking. A loaded machine only makes the bomb grow slower, so sample
	// until it has grown (40 samples at least), for up to 15 s.
	maxSeen := int64(0)
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; i < 40 || (maxSeen < 8 && time.Now().Before(deadline)); i++ {
		st, err := sb.Stats()
		if err != nil {
			t.Fatal(err)
		}
		maxSeen = max(maxSeen, st.Pids)
		if err := exec.Command("/bin/true").Run(); err != nil {
			t.Fatalf("host cannot fork during the bomb: %v", err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	if limit := pidsCap(p); maxSeen > limit || maxSeen < 8 {
		t.Fatalf("pids in sandbox peaked at %d, want the bomb held at <= %d (and running)", maxSeen, limit)
	}
}

// TestMemoryBomb: allocation past the limit ends as oom.
func TestMemoryBomb(t *testing.T) {
	res := run(t, func(p *policy.Policy) { p.Limits.MemoryBytes = 64 << 20 },
		"python3", "-c", "b = []\nwhile True: b.append(bytearray(8 << 20))")
	if res.Status != native.StatusOOM {
		t.Fatalf("status %s (exit %d, %s), want oom; stderr %q", res.Status, res.ExitCode, res.Signal, res.Stderr)
	}
	if res.PeakMemoryBytes > 80<<20 {
		t.Fatalf("peak memory %d above the 64 MiB limit", res.PeakMemoryBytes)
	}
}

// TestDiskFill: dd into /workspace stops at the disk limit.
func TestDiskFill(t *testing.T) {
	res := sh(t, func(p *policy.Policy) { p.Limits.DiskBytes = 8 << 20 },
		"dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1; ls -l /workspace/big | awk '{print $5}'")
	if !strings.Contains(res.Stdout, "No space left") {
		t.Fatalf("dd did not hit the limit: %q", res.Stdout)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	var size int64
	fmt.Sscan(lines[len(lines)-1], &size)
	if size > 8<<20 || size == 0 {
		t.Fatalf("file size %d, want (0, 8 MiB]", size)
	}
}

// TestInodeFill: creating a million files stops at the inode limit.
func TestInodeFill(t *testing.T) {
	res := run(t, func(p *policy.Policy) { p.Limits.Inodes = 500 }, "python3", "-c", `
import os, errno
n = 0
try:
    for i in range(1000000):
        open(f"/workspace/f{i}", "w").close()
        n += 1
except OSError as e:
    print("stopped", n, errno.errorcode[e.errno])
`)
	var n int
	var code string
	if _, err := fmt.Sscanf(res.Stdout, "stopped %d %s", &n, &code); err != nil || code != "ENOSPC" || n > 500 {
		t.Fatalf("got %q (%v)", res.Stdout, err)
	}
}

// TestCPUQuota: a spinner gets about its quota of CPU time.
func TestCPUQuota(t *testing.T) {
	res := sh(t, func(p *policy.Policy) {
		p.Limits.CPUs = 0.2
		p.Limits.WallTime = 1500 * time.Millisecond
	}, "while :; do :; done")
	if res.Status != native.StatusTimeout {
		t.Fatalf("status %s", res.Status)
	}
	// 0.2 CPUs over ~1.5 s is ~300 ms; unthrottled it would be ~1500 ms.
	if res.CPUMS > 0.5*res.WallMS || res.CPUMS <= 0 {
		t.Fatalf("spinner used %.0f ms of CPU in %.0f ms wall, want about 20%%", res.CPUMS, res.WallMS)
	}
}

// TestOutputFlood: `yes` ends as output_limit and the capture stays capped.
func TestOutputFlood(t *testing.T) {
	res := run(t, func(p *policy.Policy) { p.Limits.OutputBytes = 1 << 20 }, "yes")
	if res.Status != native.StatusOutputLimit || !res.Truncated || int64(len(res.Stdout)) > 1<<20 {
		t.Fatalf("status %s truncated %v len %d", res.Status, res.Truncated, len(res.Stdout))
	}
}

// TestLandlockSecondLayer: /proc is mounted read-write and a process may
// write its own /proc/self/comm as far as the kernel's permissions go;
// only Landlock refuses it. Without Landlock this test fails.
func TestLandlockSecondLayer(t *testing.T) {
	res := sh(t, nil, "echo pwned > /proc/$$/comm; cat /proc/$$/comm")
	if !strings.Contains(res.Stderr, "Permission denied") || strings.Contains(res.Stdout, "pwned") {
		t.Fatalf("write to /proc/self/comm not refused by Landlock: %q %q", res.Stdout, res.Stderr)
	}
}

// TestNoWritableCgroupfs: the sandbox sees no cgroupfs at all.
func TestNoWritableCgroupfs(t *testing.T) {
	res := sh(t, nil, "ls -A /sys/fs/cgroup 2>/dev/null; grep cgroup /proc/self/mountinfo; echo end")
	if res.Stdout != "end\n" {
		t.Fatalf("cgroupfs visible: %q", res.Stdout)
	}
}

// TestSetuidBinaryGainsNothing: a set-uid-root binary visible inside (and a
// copy of python with file capabilities) runs with the sandbox user's
// privileges only: nosuid mounts, no_new_privs and an empty bounding set.
func TestSetuidBinaryGainsNothing(t *testing.T) {
	dir, err := os.MkdirTemp("/var/tmp", "airlock-suid-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "idprobe")
	data, err := os.ReadFile("/usr/bin/id")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(bin, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o4755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(bin); fi.Mode()&os.ModeSetuid == 0 {
		t.Fatal("could not make the setuid probe")
	}
	res := sh(t, func(p *policy.Policy) {
		p.Filesystem.Mounts = append(p.Filesystem.Mounts, policy.Mount{Source: dir, Target: "/suid"})
	}, "/suid/idprobe -u; /suid/idprobe -ru; ls -l /usr/bin/su 2>/dev/null | cut -c1-10; su -c id root </dev/null 2>&1 | head -1")
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) < 2 || lines[0] != "1000" || lines[1] != "1000" {
		t.Fatalf("setuid binary changed the euid: %q %q", res.Stdout, res.Stderr)
	}
	if strings.Contains(res.Stdout, "uid=0") {
		t.Fatalf("su gained root: %q", res.Stdout)
	}
}
