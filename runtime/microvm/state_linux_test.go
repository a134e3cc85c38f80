package microvm

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/runtime/native"
)

// cell runs Python code in the guest's default context and returns its
// stdout.
func cell(t *testing.T, c *agent.Client, code string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := c.RunCode(ctx, agent.CodeRequest{Code: code})
	if err != nil {
		t.Fatalf("cell %q: %v", code, err)
	}
	res, err := cl.Collect(ctx, 1<<20)
	if err != nil {
		t.Fatalf("cell %q: %v", code, err)
	}
	if res.Error != nil {
		t.Fatalf("cell %q: %+v (stderr %q)", code, res.Error, res.Stderr)
	}
	return res.Stdout
}

// plantState leaves state of every kind in a guest: a Python variable, a
// file, a background process that counts.
func plantState(t *testing.T, c *agent.Client) {
	t.Helper()
	cell(t, c, "x = 41")
	if out, st := run(t, c, "echo kept > /workspace/f && echo ok"); st.Code != 0 || out != "ok\n" {
		t.Fatalf("write: %q %+v", out, st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := c.Exec(ctx, agent.ExecRequest{Shell: "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	waitCount(t, c, 1)
}

// waitCount waits until the background counter exceeds n and returns it.
func waitCount(t *testing.T, c *agent.Client, n int) int {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, _ := run(t, c, "cat /tmp/count 2>/dev/null || echo 0")
		v, _ := strconv.Atoi(strings.TrimSpace(out))
		if v > n {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background counter did not pass %d (at %d)", n, v)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkState checks what plantState left, and that the counter goes on
// from where it was (at least from).
func checkState(t *testing.T, c *agent.Client, from int) {
	t.Helper()
	if out := cell(t, c, "x += 1; print(x)"); out != "42\n" {
		t.Fatalf("python variable: %q", out)
	}
	if out, _ := run(t, c, "cat /workspace/f"); out != "kept\n" {
		t.Fatalf("file: %q", out)
	}
	waitCount(t, c, from+1)
}

// alive reports whether pid is a running process.
func alive(pid int) bool { return unix.Kill(pid, 0) == nil }

// TestMicroVMPauseToDisk pauses a guest to disk (QEMU's migration to a
// file, QEMU quits) and resumes it from the file in a new QEMU: a Python
// variable, a file and a background process survive, the agent's
// connection goes on, and no QEMU runs (no task in its cgroup) while it is
// paused.
func TestMicroVMPauseToDisk(t *testing.T) {
	vm, c := bootGuest(t)
	plantState(t, c)
	before := waitCount(t, c, 0)
	pid := vm.Pid()
	image := filepath.Join(t.TempDir(), "checkpoint")
	start := time.Now()
	if err := vm.Suspend(image); err != nil {
		t.Fatal(err)
	}
	t.Logf("pause to disk: %s", time.Since(start).Round(time.Millisecond))
	if alive(pid) {
		t.Fatalf("QEMU (pid %d) still runs while the guest is paused to disk", pid)
	}
	if procs, err := os.ReadFile(filepath.Join(vm.group.Dirs()[0], "cgroup.procs")); err != nil || len(strings.TrimSpace(string(procs))) > 0 {
		t.Fatalf("the sandbox's cgroup holds tasks while paused to disk: %q %v", procs, err)
	}
	fi, err := os.Stat(filepath.Join(image, memoryFile))
	if err != nil || fi.Size() < 1<<20 {
		t.Fatalf("the saved state: %v %v", fi, err)
	}
	if st, err := vm.Stats(); err == nil {
		t.Logf("saved state %d MiB; the cgroup's memory while paused: %d KiB", fi.Size()>>20, st.MemoryBytes>>10)
	}
	select {
	case <-vm.Done():
		t.Fatal("the VM counts as ended while paused to disk")
	default:
	}
	log, err := os.Create(filepath.Join(t.TempDir(), "resume.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	start = time.Now()
	if err := vm.Resume(image, log); err != nil {
		b, _ := os.ReadFile(log.Name())
		t.Fatalf("resume: %v\n%s", err, b)
	}
	t.Logf("resume from disk: %s", time.Since(start).Round(time.Millisecond))
	if vm.Pid() == pid || !alive(vm.Pid()) {
		t.Fatalf("the resumed guest's QEMU: pid %d (was %d)", vm.Pid(), pid)
	}
	checkState(t, c, before)
	// And again: a resumed guest pauses and resumes as well.
	image2 := image + "2"
	if err := vm.Suspend(image2); err != nil {
		t.Fatal(err)
	}
	if err := vm.Resume(image2, log); err != nil {
		t.Fatal(err)
	}
	if out := cell(t, c, "print(x)"); out != "42\n" {
		t.Fatalf("python variable after a second pause: %q", out)
	}
}

// forkGuest starts a fork of the snapshot in image, with edit applied to
// its configuration (as bootGuestWith's), and returns it with a client
// that continues the snapshotted agent session.
func forkGuest(t *testing.T, image string, edit func(*native.Config)) (*VM, *agent.Client) {
	t.Helper()
	dir := t.TempDir()
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
	cfg := native.Config{ID: fmt.Sprintf("mvf-%d-%s", os.Getpid(), filepath.Base(dir)), Policy: testPolicy(t),
		Args: []string{native.AgentPath, "__agent", "--user", "1000:1000"}, Stdin: stdin, Stdout: logf, Stderr: logf,
		Agent: true, AgentBinary: agentBinary(t)}
	if edit != nil {
		edit(&cfg)
	}
	start := time.Now()
	inst, _, err := Tier{}.Fork(cfg, image)
	stdin.Close()
	if err != nil {
		b, _ := os.ReadFile(logf.Name())
		t.Fatalf("fork: %v\nconsole:\n%s", err, b)
	}
	vm := inst.(*VM)
	t.Cleanup(func() { vm.Destroy() })
	conn, err := net.FileConn(hostEnd)
	hostEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := agent.ContinueClient(conn, agent.Config{Home: "/workspace"})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("the fork's agent: %v", err)
	}
	t.Logf("fork to agent ping: %s", time.Since(start).Round(time.Millisecond))
	return vm, c
}

// TestMicroVMSnapshotFork snapshots a running guest (it runs on) and forks
// it twice: each fork has the snapshot's Python variable, file and
// background process, writes only its own files, runs in its own QEMU on
// its own agent channel and cgroup, and lives on after the original is
// killed.
func TestMicroVMSnapshotFork(t *testing.T) {
	orig, c := bootGuest(t)
	plantState(t, c)
	at := waitCount(t, c, 0)
	image := filepath.Join(t.TempDir(), "snap")
	start := time.Now()
	if err := orig.Snapshot(image); err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot while running: %s", time.Since(start).Round(time.Millisecond))
	checkState(t, c, at) // the original runs on: x is 42 there now
	run(t, c, "echo original > /workspace/who")
	var forks []*VM
	var clients []*agent.Client
	for i := 0; i < 2; i++ {
		vm, fc := forkGuest(t, image, nil)
		forks, clients = append(forks, vm), append(clients, fc)
		checkState(t, fc, at) // x was 41 at the snapshot
		run(t, fc, fmt.Sprintf("echo fork%d > /workspace/who", i))
	}
	if forks[0].Pid() == forks[1].Pid() || forks[0].Pid() == orig.Pid() || forks[0].group.Dirs()[0] == orig.group.Dirs()[0] {
		t.Fatal("forks share a QEMU or a cgroup")
	}
	if err := orig.Destroy(); err != nil {
		t.Fatal(err)
	}
	for i, fc := range clients {
		if out, _ := run(t, fc, "cat /workspace/who"); out != fmt.Sprintf("fork%d\n", i) {
			t.Fatalf("fork %d sees %q after the original's end", i, out)
		}
		if out := cell(t, fc, "print(x)"); out != "42\n" {
			t.Fatalf("fork %d: x = %q", i, out)
		}
	}
	// A fork is a guest like any other: snapshotted twice by the same
	// QEMU, forked again, paused to disk and resumed.
	for n := 0; n < 2; n++ {
		if err := forks[0].Snapshot(filepath.Join(t.TempDir(), "again")); err != nil {
			t.Fatalf("snapshot %d of a fork: %v", n, err)
		}
	}
	again := filepath.Join(t.TempDir(), "fork-of-fork")
	if err := forks[0].Snapshot(again); err != nil {
		t.Fatal(err)
	}
	_, gc := forkGuest(t, again, nil)
	if out, _ := run(t, gc, "cat /workspace/who"); out != "fork0\n" {
		t.Fatalf("a fork of a fork: %q", out)
	}
	pause := filepath.Join(t.TempDir(), "pause")
	if err := forks[0].Suspend(pause); err != nil {
		t.Fatal(err)
	}
	if err := forks[0].Resume(pause, nil); err != nil {
		t.Fatal(err)
	}
	if out := cell(t, clients[0], "x += 1; print(x)"); out != "43\n" {
		t.Fatalf("a fork after its pause to disk: x = %q", out)
	}
}

// TestMicroVMForkImageRoot: a snapshot of a guest on an image root
// carries a copy of its upper disk; each fork writes a copy of its own,
// so the original's later writes and each fork's stay apart.
func TestMicroVMForkImageRoot(t *testing.T) {
	if err := (Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	agentBinary(t)
	layers := testLayers(t)
	withRoot := func(dir string) func(*native.Config) {
		return func(cfg *native.Config) {
			cfg.Image = &native.ImageRoot{Layers: layers, Dir: dir}
			cfg.Policy.Limits.DiskBytes = 64 << 20
		}
	}
	orig, c := bootGuestWith(t, withRoot(t.TempDir()))
	if out, st := run(t, c, "echo before > /workspace/a; mkdir /workspace/d; echo before > /workspace/d/b; sync; echo ok"); out != "ok\n" || st.Code != 0 {
		t.Fatalf("write: %q", out)
	}
	image := filepath.Join(t.TempDir(), "snap")
	start := time.Now()
	if err := orig.Snapshot(image); err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot with its upper disk: %s", time.Since(start).Round(time.Millisecond))
	run(t, c, "echo after > /workspace/a; sync")
	var clients []*agent.Client
	for i := 0; i < 2; i++ {
		_, fc := forkGuest(t, image, withRoot(t.TempDir()))
		clients = append(clients, fc)
		if out, _ := run(t, fc, "cat /workspace/a /workspace/d/b"); out != "before\nbefore\n" {
			t.Fatalf("fork %d's root: %q", i, out)
		}
		run(t, fc, fmt.Sprintf("echo fork%d > /workspace/a; sync", i))
	}
	for i, fc := range clients {
		if out, _ := run(t, fc, "cat /workspace/a"); out != fmt.Sprintf("fork%d\n", i) {
			t.Fatalf("fork %d: %q", i, out)
		}
	}
	if out, _ := run(t, c, "cat /workspace/a"); out != "after\n" {
		t.Fatalf("original: %q", out)
	}
}

// TestMicroVMTamperedStateEndsOnlyItsVM: the saved state of a guest paused
// to disk is QEMU's to read, never the host's: a stream altered on disk (as
// a guest that took over its own QEMU could write it) makes the resume
// fail, that VM ends with the reason, no QEMU of it is left, and another
// guest goes on answering.
func TestMicroVMTamperedStateEndsOnlyItsVM(t *testing.T) {
	other, oc := bootGuest(t)
	for i, tamper := range []func(f *os.File, size int64) error{
		func(f *os.File, size int64) error { // garbage over the middle
			junk := make([]byte, 64<<10)
			for i := range junk {
				junk[i] = byte(i*7 + 3)
			}
			_, err := f.WriteAt(junk, size/2)
			return err
		},
		func(f *os.File, size int64) error { return f.Truncate(size / 3) }, // cut short
		func(f *os.File, size int64) error { // a header that is not QEMU's
			_, err := f.WriteAt([]byte("\x00\x00\x00\x00notqemu"), 0)
			return err
		},
	} {
		vm, c := bootGuest(t)
		run(t, c, "echo x > /workspace/f")
		image := filepath.Join(t.TempDir(), "checkpoint")
		if err := vm.Suspend(image); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(filepath.Join(image, memoryFile), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		if err := tamper(f, fi.Size()); err != nil {
			t.Fatal(err)
		}
		f.Close()
		err = vm.Resume(image, nil)
		if err == nil {
			// Garbage in guest RAM pages is the guest's own business: QEMU
			// loads it, and the guest may run on or crash; only this VM.
			t.Logf("case %d: the altered state loaded (the change was inside guest memory)", i)
		} else {
			t.Logf("case %d: resume refused: %v", i, err)
			vm.End()
			select {
			case <-vm.Done():
			default:
				t.Fatalf("case %d: the VM does not count as ended after a failed resume", i)
			}
		}
		vm.Destroy()
		if out, err := exec.Command("pgrep", "-f", "airlock-"+vm.id+" ").CombinedOutput(); err == nil {
			t.Fatalf("case %d: a QEMU of the tampered VM is left: %s", i, out)
		}
		if out, _ := run(t, oc, "echo alive"); out != "alive\n" {
			t.Fatalf("case %d: the other guest: %q", i, out)
		}
	}
	if !alive(other.Pid()) {
		t.Fatal("the other guest's QEMU ended")
	}
}

// TestPruneRunDirs: the state directory of a one-shot run whose launcher
// died is removed at the next start; a live launcher's and a server
// sandbox's stay.
func TestPruneRunDirs(t *testing.T) {
	old := StateDir
	StateDir = t.TempDir()
	defer func() { StateDir = old }()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	names := []string{fmt.Sprintf("run-%d-a", dead.Process.Pid), fmt.Sprintf("run-%d-b", os.Getpid()), "sb-c"}
	for _, n := range names {
		if err := os.Mkdir(filepath.Join(StateDir, n), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	pruneRunDirs()
	for i, n := range names {
		_, err := os.Stat(filepath.Join(StateDir, n))
		if gone := err != nil; gone != (i == 0) {
			t.Errorf("%s: gone %v", n, gone)
		}
	}
}
