package native_test

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// inotifyHold creates up to argv[1] inotify instances, prints how many it
// got, and keeps them.
const inotifyHold = `import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
for _ in range(int(sys.argv[1])):
    if libc.inotify_init() < 0:
        break
    n += 1
print(n, flush=True)
time.sleep(120)
`

// maxInotify is the host's per-user inotify instance limit.
func maxInotify(t *testing.T) int {
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		t.Fatalf("max_user_instances %q", b)
	}
	return n
}

// holdInotify starts a sandbox that takes up to n inotify instances and
// returns it with the number it got.
func holdInotify(t *testing.T, profile policy.Profile, n int) (*native.Sandbox, int) {
	t.Helper()
	p, err := policy.Preset(profile)
	if err != nil {
		t.Fatal(err)
	}
	p.Limits.OpenFiles = uint64(n + 64)
	return startCounting(t, p, inotifyHold, n)
}

// startCounting starts a sandbox running Python script with argument n,
// which prints one count and keeps running; it returns the sandbox and
// the count.
func startCounting(t *testing.T, p policy.Policy, script string, n int) (*native.Sandbox, int) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sb, err := native.Start(native.Config{Policy: p, Args: []string{"/usr/bin/python3", "-c", script, strconv.Itoa(n)}, Stdout: w})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy() })
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		t.Fatalf("%s sandbox: no count: %v", p.Profile, err)
	}
	got, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("%s sandbox printed %q", p.Profile, line)
	}
	return sb, got
}

// hostUID is the real uid of a process as the host sees it.
func hostUID(t *testing.T, pid int) int {
	t.Helper()
	f := strings.Fields(hostStatus(t, pid)["Uid"])
	if len(f) == 0 {
		t.Fatalf("no Uid for pid %d", pid)
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// TestOwnIDRange (issue 20, finding 4): a sandbox that takes every inotify
// instance its user may have leaves another sandbox, and the host's root,
// able to create theirs; two live sandboxes run as different host uids,
// checked from the host.
func TestOwnIDRange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("per-sandbox id ranges need root")
	}
	limit := maxInotify(t)
	if limit > 4096 {
		t.Skipf("max_user_instances is %d: too many instances to hold in a test", limit)
	}
	for _, prof := range []policy.Profile{policy.Strict, policy.Standard, policy.Light} {
		t.Run(string(prof), func(t *testing.T) {
			a, gotA := holdInotify(t, prof, limit+1)
			if gotA != limit {
				t.Fatalf("sandbox A got %d inotify instances, want the per-user limit %d", gotA, limit)
			}
			b, gotB := holdInotify(t, prof, 1)
			if gotB != 1 {
				t.Errorf("sandbox B could not create an inotify instance while A holds %d: per-user limits shared across sandboxes", gotA)
			}
			fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			if err != nil {
				t.Errorf("host root cannot create an inotify instance while sandbox A holds %d: %v", gotA, err)
			} else {
				unix.Close(fd)
			}
			ua, ub := hostUID(t, a.Pid), hostUID(t, b.Pid)
			if ua == ub || ua == 0 || ub == 0 {
				t.Errorf("host uids of two live sandboxes: %d and %d, want two different non-root uids", ua, ub)
			}
			if d := ua - ub; d > -65536 && d < 65536 {
				t.Errorf("host uids %d and %d are within one 65536-id range", ua, ub)
			}
		})
	}
}

// TestWorkspaceKeepsItsRange: a host workspace belongs to the id range of
// the run that created it; a later run gets that range again (and can use
// its files), while a run that would share it with a live sandbox is
// refused.
func TestWorkspaceKeepsItsRange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("per-sandbox id ranges need root")
	}
	dir := t.TempDir() + "/ws"
	withWS := func(p *policy.Policy) { p.Filesystem.Workspace = dir }
	if res := sh(t, withWS, "echo kept > /workspace/f"); res.Status != native.StatusOK {
		t.Fatalf("first run: %+v", res)
	}
	if res := sh(t, withWS, "cat /workspace/f && echo more >> /workspace/f"); res.Status != native.StatusOK || res.Stdout != "kept\n" {
		t.Fatalf("second run: %+v", res)
	}
	p := strict(t)
	withWS(&p)
	a, err := native.Start(native.Config{Policy: p, Args: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy()
	_, err = native.Run(context.Background(), native.Config{Policy: p, Args: []string{"true"}}, native.RunOptions{})
	if err == nil || !strings.Contains(err.Error(), "in use by another live sandbox") {
		t.Fatalf("a second sandbox on a live sandbox's workspace: %v", err)
	}
}

// pipeHog grows pipes to 1 MiB until the kernel refuses (the user's
// pipe-user-pages-soft budget is spent), prints how many it grew, and keeps
// them; with argv[1] == "1" it grows a single pipe.
const pipeHog = `import fcntl, os, sys, time
n = 0
pipes = []
while n < int(sys.argv[1]):
    r, w = os.pipe()
    pipes.append((r, w))
    try:
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError:
        break
    n += 1
print(n, flush=True)
time.sleep(120)
`

// TestOwnPipeBudget (issue 20, finding 4): a sandbox that spends its
// user's pipe-buffer budget leaves another sandbox able to grow a pipe.
func TestOwnPipeBudget(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("per-sandbox id ranges need root")
	}
	b, err := os.ReadFile("/proc/sys/fs/pipe-user-pages-soft")
	if err != nil {
		t.Fatal(err)
	}
	soft, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if soft <= 0 || soft > 1<<16 {
		t.Skipf("pipe-user-pages-soft %q: no budget a test can spend", b)
	}
	// 1 MiB pipes are 256 pages: the budget runs out after soft/256 of them.
	hog := func(n int) (*native.Sandbox, int) {
		p := strict(t)
		p.Limits.OpenFiles = uint64(2*n + 64)
		return startCounting(t, p, pipeHog, n)
	}
	max := soft/256 + 8
	_, gotA := hog(max)
	if gotA >= max {
		t.Fatalf("sandbox A grew %d pipes to 1 MiB without reaching the budget of %d pages", gotA, soft)
	}
	if _, gotB := hog(1); gotB != 1 {
		t.Errorf("sandbox B could not grow a pipe to 1 MiB while A holds %d of them: pipe budget shared across sandboxes", gotA)
	}
}

// TestLauncherKeepsDumpable: starting a sandbox (whose namespace is created
// under another effective uid) leaves the launcher's dumpable flag and
// parent-death signal as they were.
func TestLauncherKeepsDumpable(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGUSR2), 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Prctl(unix.PR_SET_PDEATHSIG, 0, 0, 0, 0)
	before, _ := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	res := run(t, nil, "true")
	if res.Status != native.StatusOK {
		t.Fatalf("%+v", res)
	}
	if after, _ := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); after != before {
		t.Errorf("dumpable %d after a sandbox start, was %d", after, before)
	}
	var sig int32
	if err := unix.Prctl(unix.PR_GET_PDEATHSIG, uintptr(unsafe.Pointer(&sig)), 0, 0, 0); err != nil || sig != int32(unix.SIGUSR2) {
		t.Errorf("parent-death signal %d after a sandbox start, want SIGUSR2 (%v)", sig, err)
	}
}
