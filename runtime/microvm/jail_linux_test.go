package microvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// jailProbeEnv makes the test binary a probe (TestMain): a stand-in for a
// compromised QEMU, run by nsenter in a QEMU's pid, network, IPC and UTS
// namespaces, that enters its mount namespace and root, takes its uid and
// gid, and reports what it can reach.
const jailProbeEnv = "AIRLOCK_TEST_JAIL_PROBE"

// maxProbeFiles bounds the files the probe lists.
const maxProbeFiles = 1000

// probeSpec is what the probe is asked.
type probeSpec struct {
	Pid      int      `json:"pid"` // the QEMU whose mount namespace and root it enters
	UID, GID int      // QEMU's
	Paths    []string `json:"paths"`  // host paths it tries
	Signal   int      `json:"signal"` // another sandbox's QEMU (host pid) it tries to signal
}

// probeReport is what the probe found.
type probeReport struct {
	Err        string            `json:"err,omitempty"`
	UID        int               `json:"uid"`
	Reached    map[string]string `json:"reached"` // path -> "" if it exists, else the error
	Files      []string          `json:"files"`   // every non-directory under its /
	Interfaces []string          `json:"interfaces"`
	Signal     string            `json:"signal"` // kill(Signal, 0)'s error, "" if it succeeded
}

func jailProbe(specJSON string) {
	var spec probeSpec
	rep := probeReport{Reached: map[string]string{}}
	defer func() {
		json.NewEncoder(os.Stdout).Encode(rep)
		os.Exit(0)
	}()
	fail := func(step string, err error) { rep.Err = step + ": " + err.Error() }
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fail("spec", err)
		return
	}
	// Mount namespaces are per thread once the thread has its own fs.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		fail("unshare fs", err)
		return
	}
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", spec.Pid), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fail("open root", err)
		return
	}
	mnt, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", spec.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fail("open mnt ns", err)
		return
	}
	if err := unix.Setns(mnt, unix.CLONE_NEWNS); err != nil {
		fail("setns mnt", err)
		return
	}
	if err := unix.Fchdir(root); err != nil {
		fail("fchdir root", err)
		return
	}
	if err := unix.Chroot("."); err != nil {
		fail("chroot", err)
		return
	}
	unix.Close(root)
	unix.Close(mnt)
	if err := syscall.Setgroups(nil); err != nil {
		fail("setgroups", err)
		return
	}
	if err := syscall.Setresgid(spec.GID, spec.GID, spec.GID); err != nil {
		fail("setresgid", err)
		return
	}
	if err := syscall.Setresuid(spec.UID, spec.UID, spec.UID); err != nil {
		fail("setresuid", err)
		return
	}
	rep.UID = os.Getuid()
	for _, p := range spec.Paths {
		_, err := os.Lstat(p)
		rep.Reached[p] = ""
		if err != nil {
			rep.Reached[p] = err.Error()
		}
	}
	// At most maxProbeFiles: a jail holds a few hundred; the host's tree
	// (a missing jail) is cut short.
	filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rep.Files = append(rep.Files, p)
		}
		if len(rep.Files) >= maxProbeFiles {
			return filepath.SkipAll
		}
		return nil
	})
	ifs, err := net.Interfaces()
	if err != nil {
		fail("interfaces", err)
	}
	for _, i := range ifs {
		rep.Interfaces = append(rep.Interfaces, i.Name)
	}
	rep.Signal = "signalled"
	if err := unix.Kill(spec.Signal, 0); err != nil {
		rep.Signal = err.Error()
	}
}

// procIDs reads pid's real uid and gid.
func procIDs(t *testing.T, pid int) (int, int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && (f[0] == "Uid:" || f[0] == "Gid:") {
			ids[f[0]], _ = strconv.Atoi(f[1])
		}
	}
	return ids["Uid:"], ids["Gid:"]
}

// TestMicroVMJail: QEMU runs in mount, pid, network, IPC and UTS
// namespaces of its own (they differ from the server's), with an empty
// capability bounding set and no_new_privs, and a process in
// those namespaces, in QEMU's root and with QEMU's uid and gid (what a
// guest that took over its QEMU would be), reaches no host path but
// QEMU's own files (no /etc/shadow, /home, /proc, the agent binary, the
// other VM's state directory), has no network interface but lo, and
// cannot signal another sandbox's QEMU, even one of the same uid (both
// run as nobody here, without a leased id range).
func TestMicroVMJail(t *testing.T) {
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("no nsenter")
	}
	a, _ := bootGuest(t)
	b, _ := bootGuest(t)
	for _, ns := range []string{"mnt", "pid", "net", "ipc", "uts"} {
		mine, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			t.Fatal(err)
		}
		its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", a.Pid(), ns))
		if err != nil {
			t.Fatal(err)
		}
		if its == mine {
			t.Errorf("QEMU shares the server's %s namespace (%s)", ns, its)
		}
	}
	// No capability can come back: its bounding set is empty, and
	// no_new_privs is set.
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st), "\nCapBnd:\t0000000000000000\n") || !strings.Contains(string(st), "\nNoNewPrivs:\t1\n") {
		t.Errorf("QEMU's capability bounding set is not empty or no_new_privs is not set:\n%s", st)
	}
	uid, gid := procIDs(t, a.Pid())
	secret := []string{"/etc/shadow", "/etc/passwd", "/etc", "/home", "/root", "/proc", "/sys", "/var/lib", "/run",
		filepath.Join(StateDir, b.id), filepath.Join(StateDir, a.id, launchFile), agentPath}
	if self, err := os.Executable(); err == nil {
		secret = append(secret, self)
	}
	spec, _ := json.Marshal(probeSpec{Pid: a.Pid(), UID: uid, GID: gid, Paths: secret, Signal: b.Pid()})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "-t", strconv.Itoa(a.Pid()), "-p", "-n", "-i", "-u", "--", self)
	cmd.Env = []string{jailProbeEnv + "=" + string(spec)}
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("probe: %v: %s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var rep probeReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("probe's report %q: %v", out, err)
	}
	if rep.Err != "" || rep.UID != uid {
		t.Fatalf("probe: %s (uid %d, want %d)", rep.Err, rep.UID, uid)
	}
	for _, p := range secret {
		if rep.Reached[p] == "" {
			t.Errorf("QEMU's jail reaches host path %s", p)
		}
	}
	// Every file it sees is QEMU's: its binary, libraries and firmware,
	// the kernel, the initramfs and images in the cache, device nodes.
	allowed := []string{"/usr/bin/qemu-system-", "/usr/lib/x86_64-linux-gnu/", "/lib64/", qemuDataDir + "/", "/boot/vmlinuz-",
		CacheDir + "/initramfs-", CacheDir + "/usr-", "/dev/"}
	var foreign []string
	for _, f := range rep.Files {
		if !slices.ContainsFunc(allowed, func(p string) bool { return strings.HasPrefix(f, p) }) {
			foreign = append(foreign, f)
		}
	}
	if len(foreign) > 0 {
		t.Errorf("QEMU's jail holds %d files that are not QEMU's, the first: %v", len(foreign), foreign[:min(len(foreign), 10)])
	}
	if len(rep.Files) < 10 || len(rep.Files) >= maxProbeFiles {
		t.Errorf("QEMU's jail holds %d files (at most %d listed)", len(rep.Files), maxProbeFiles)
	}
	if !slices.Equal(rep.Interfaces, []string{"lo"}) {
		t.Errorf("network interfaces in QEMU's namespace: %v, want only lo", rep.Interfaces)
	}
	if rep.Signal != unix.ESRCH.Error() {
		t.Errorf("signal 0 to the other sandbox's QEMU (pid %d) from QEMU's namespaces: %s, want %s", b.Pid(), rep.Signal, unix.ESRCH)
	}
	t.Logf("jail: %d files; uid %d; interfaces %v; kill(other QEMU, 0): %s", len(rep.Files), rep.UID, rep.Interfaces, rep.Signal)
}

// BenchmarkJailedStart measures the jail's cost: from the helper's fork to
// QEMU's exec in its jail (QEMU then prints its version and exits).
func BenchmarkJailedStart(b *testing.B) {
	q, err := qemuPath()
	if err != nil {
		b.Skip(err)
	}
	StateDir = b.TempDir() + "/state"
	l := &launch{q: q, cred: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if _, err := jailBinds(q, []string{"-accel", "tcg"}); err != nil { // QEMU's files, found once per process
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		j, err := l.jailed([]string{"-accel", "tcg", "-version"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := j.start(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := j.Wait(); err != nil {
			b.Fatalf("qemu -version in its jail: %v", err)
		}
		b.StartTimer()
	}
}

// TestJailFailsClosed: a jail the helper cannot build is an error that
// names the cause, with no process left; a host path QEMU is told to open
// by an option the jail does not know (here the generic loader's file=)
// is not in the jail, so QEMU cannot read it and fails.
func TestJailFailsClosed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	q, err := qemuPath()
	if err != nil {
		t.Skip(err)
	}
	StateDir = t.TempDir() + "/state"
	l := &launch{q: q, cred: &syscall.Credential{Uid: nobody, Gid: nobody}}
	j, err := l.jailed([]string{"-accel", "tcg", "-kernel", "/nonexistent/vmlinuz", "-version"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = j.start()
	if err == nil || !strings.Contains(err.Error(), "bind /nonexistent/vmlinuz") {
		t.Fatalf("a jail with a missing file: %v", err)
	}
	if j.ProcessState == nil {
		t.Fatal("the helper was not waited for")
	}

	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("HOST SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	j, err = l.jailed([]string{"-M", "microvm", "-accel", "tcg", "-nodefaults", "-display", "none",
		"-device", "loader,file=" + secret + ",addr=0x100000"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	j.Stdout, j.Stderr = &out, &out
	if err := j.start(); err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(); err == nil || !strings.Contains(out.String(), secret) || !strings.Contains(out.String(), "No such file") {
		t.Fatalf("QEMU given a host path the jail does not hold: %v: %q", err, out.String())
	}
	t.Logf("QEMU: %s", strings.TrimSpace(out.String()))
}
