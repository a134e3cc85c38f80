package idrange

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startSleeper starts a process that lives until the test kills it (or
// ends).
func startSleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	return c
}

// deadPid returns the pid of a process that has exited.
func deadPid(t *testing.T) int {
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

func TestLeases(t *testing.T) {
	p := Pool{Dir: t.TempDir() + "/ranges", First: DefaultFirst}
	me := os.Getpid()
	a, err := p.Acquire(me, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Acquire(me, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Base != DefaultFirst || b.Base != DefaultFirst+Size {
		t.Fatalf("bases %d, %d: want the first two ranges", a.Base, b.Base)
	}
	// Ranges the caller knows to be taken are skipped.
	c, err := p.Acquire(me, 0, func(base int) bool { return base == DefaultFirst+2*Size })
	if err != nil || c.Base != DefaultFirst+3*Size {
		t.Fatalf("skip: got %v, %v", c, err)
	}
	// Released: reused first.
	a.Release()
	if d, err := p.Acquire(me, 0, nil); err != nil || d.Base != DefaultFirst {
		t.Fatalf("after release: got %v, %v", d, err)
	}
	// A live holder's range cannot be preferred or claimed by another.
	if _, err := p.Acquire(me, b.Base, nil); !errors.Is(err, ErrInUse) {
		t.Fatalf("prefer a live lease: %v", err)
	}
	sleeper := startSleeper(t)
	if _, err := p.Claim(b.Base, sleeper.Process.Pid); !errors.Is(err, ErrInUse) {
		t.Fatalf("claim a range held by another live process: %v", err)
	}
	// A lease whose holder died (a crash) is free again.
	if err := b.SetHolder(sleeper.Process.Pid); err != nil {
		t.Fatal(err)
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	if e, err := p.Acquire(me, b.Base, nil); err != nil || e.Base != b.Base {
		t.Fatalf("range of a dead holder: got %v, %v", e, err)
	}
	// A late Release of the dead holder's lease leaves the new lease alone.
	b.Release()
	if _, err := p.Acquire(me, b.Base, nil); !errors.Is(err, ErrInUse) {
		t.Fatalf("stale Release freed another's lease: %v", err)
	}
	if _, err := p.Acquire(deadPid(t), 0, nil); err == nil {
		t.Fatal("lease for a dead holder granted")
	}
}

// BenchmarkAcquireRelease is the cost a lease adds to a sandbox start,
// with 100 other live leases in the directory.
func BenchmarkAcquireRelease(b *testing.B) {
	p := Pool{Dir: b.TempDir() + "/ranges", First: DefaultFirst}
	me := os.Getpid()
	for i := 0; i < 100; i++ {
		if _, err := p.Acquire(me, 0, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, err := p.Acquire(me, 0, nil)
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
	}
}

// BenchmarkAcquireReleaseKnown is the server's case: the 100 live leases
// are its own sandboxes, which its store lists (skip), so none is read.
func BenchmarkAcquireReleaseKnown(b *testing.B) {
	p := Pool{Dir: b.TempDir() + "/ranges", First: DefaultFirst}
	me := os.Getpid()
	known := map[int]bool{}
	for i := 0; i < 100; i++ {
		l, err := p.Acquire(me, 0, nil)
		if err != nil {
			b.Fatal(err)
		}
		known[l.Base] = true
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, err := p.Acquire(me, 0, func(base int) bool { return known[base] })
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
	}
}

// TestCrashLeftoverReclaimed: a lease left by a crashed holder is freed by
// later allocations, and its range handed out again.
func TestCrashLeftoverReclaimed(t *testing.T) {
	p := Pool{Dir: t.TempDir() + "/ranges", First: DefaultFirst}
	sleeper := startSleeper(t)
	l, err := p.Acquire(sleeper.Process.Pid, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	got, err := p.Acquire(os.Getpid(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Base != l.Base {
		t.Fatalf("got range %d, want the crashed holder's %d back", got.Base, l.Base)
	}
}

// TestZombieHolderReclaimed: a holder that has exited but is not reaped
// yet (a zombie: a sandbox process whose server was killed is left to PID
// 1, which may reap it late) holds no range. Before, its lease looked
// live, and a restarted server could not reclaim or reuse the range
// ("host id range in use by another live sandbox").
func TestZombieHolderReclaimed(t *testing.T) {
	p := Pool{Dir: t.TempDir() + "/ranges", First: DefaultFirst}
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer c.Wait()
	l, err := p.Acquire(c.Process.Pid, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Process.Kill() // not waited for: a zombie until the deferred Wait
	for i := 0; ; i++ {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Process.Pid)); err == nil && strings.Contains(string(b), ") Z ") {
			break
		}
		if i > 600 {
			t.Fatal("the killed holder never became a zombie")
		}
		time.Sleep(50 * time.Millisecond)
	}
	got, err := p.Claim(l.Base, os.Getpid())
	if err != nil {
		t.Fatalf("a zombie's range cannot be claimed: %v", err)
	}
	if got.Base != l.Base {
		t.Fatalf("claimed %d, want %d", got.Base, l.Base)
	}
}

// TestFree: Free removes a lease whose holder died, never a live one.
func TestFree(t *testing.T) {
	p := Pool{Dir: t.TempDir() + "/ranges", First: DefaultFirst}
	live, err := p.Acquire(os.Getpid(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Free(live.Base); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(live.path()); err != nil {
		t.Fatalf("Free removed a live lease: %v", err)
	}
	dead, err := p.Acquire(deadPid(t), 0, nil)
	if err == nil {
		t.Fatalf("lease for a dead holder: %v", dead)
	}
	sleeper := startSleeper(t)
	l, err := p.Acquire(sleeper.Process.Pid, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	if err := p.Free(l.Base); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.path()); !os.IsNotExist(err) {
		t.Fatalf("lease of a dead holder still there: %v", err)
	}
}

// TestDirHolder: a lease handed to a directory stays taken while that
// directory exists, whatever becomes of the processes (its first holder
// dies, as a gVisor sandbox's runsc does at a checkpoint): Reap leaves it,
// Acquire skips it, ClaimDir with the same directory re-takes it and a
// claim by a process is refused. Removed, the directory frees it.
func TestDirHolder(t *testing.T) {
	p := Pool{Dir: t.TempDir() + "/ranges", First: DefaultFirst}
	dir := t.TempDir() + "/sandbox"
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sleeper := startSleeper(t)
	l, err := p.Acquire(sleeper.Process.Pid, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetHolderDir(dir); err != nil {
		t.Fatal(err)
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	if n, err := p.Reap(); err != nil || n != 0 {
		t.Fatalf("Reap removed %d leases (%v), want the directory's kept", n, err)
	}
	other, err := p.Acquire(os.Getpid(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if other.Base == l.Base {
		t.Fatalf("Acquire handed out %d, held by %s", other.Base, dir)
	}
	other.Release()
	if _, err := p.Acquire(os.Getpid(), l.Base, nil); !errors.Is(err, ErrInUse) {
		t.Fatalf("Acquire of the held range: %v, want ErrInUse", err)
	}
	if _, err := p.Claim(l.Base, os.Getpid()); !errors.Is(err, ErrInUse) {
		t.Fatalf("Claim by a process of the held range: %v, want ErrInUse", err)
	}
	if _, err := p.ClaimDir(l.Base, dir); err != nil {
		t.Fatalf("ClaimDir by its own directory: %v", err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	// The directory gone, the lease goes. (Holders are sandbox state
	// directories named by random ids, never made again at the same path;
	// a directory made again there could even get the old inode back, so
	// that case is not asserted.)
	if err := p.Free(l.Base); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.Dir + "/" + fmt.Sprint(l.Base)); !os.IsNotExist(err) {
		t.Fatalf("the lease of a removed directory is left: %v", err)
	}
	if _, err := p.Acquire(os.Getpid(), l.Base, nil); err != nil {
		t.Fatalf("Acquire once the directory is gone: %v", err)
	}
}

// TestSetHolderInPlace: handing a lease to another holder rewrites its
// file in place (the same inode: no rename over it, which on ext4 flushes
// the file to disk first), from a longer holder text to a shorter one and
// back; the lease stays the new holder's throughout, leaves no temporary
// file, and is removed by Release.
func TestSetHolderInPlace(t *testing.T) {
	p := Pool{Dir: t.TempDir() + "/ranges", First: DefaultFirst}
	l, err := p.Acquire(os.Getpid(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := p.Dir + "/" + fmt.Sprint(l.Base)
	inode := func() uint64 {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	ino := inode()
	dir := t.TempDir() + "/a-sandbox-state-directory-with-a-long-name"
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sleeper := startSleeper(t)
	for _, set := range []func() error{
		func() error { return l.SetHolderDir(dir) },
		func() error { return l.SetHolder(sleeper.Process.Pid) },
		func() error { return l.SetHolderDir(dir) },
		func() error { return l.SetHolder(sleeper.Process.Pid) },
	} {
		if err := set(); err != nil {
			t.Fatal(err)
		}
		if got := inode(); got != ino {
			t.Fatalf("the lease file was replaced (inode %d, was %d)", got, ino)
		}
		b, _ := os.ReadFile(path)
		if h, ok := parseHolder(b); !ok || h != l.h {
			t.Fatalf("lease reads %q: %+v, want %+v", b, h, l.h)
		}
		if _, err := p.Acquire(os.Getpid(), l.Base, nil); !errors.Is(err, ErrInUse) {
			t.Fatalf("Acquire of the held range: %v, want ErrInUse", err)
		}
	}
	if ents, _ := os.ReadDir(p.Dir); len(ents) != 2 { // the lock and the lease
		t.Fatalf("directory holds %v", ents)
	}
	l.Release()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("Release left the lease: %v", err)
	}
}

// BenchmarkAcquireHandRelease is a one-shot run's whole cycle: lease for
// the launcher, hand the lease to the sandbox's init, release.
func BenchmarkAcquireHandRelease(b *testing.B) {
	p := Pool{Dir: b.TempDir() + "/ranges", First: DefaultFirst}
	me := os.Getpid()
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { c.Process.Kill(); c.Wait() }()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, err := p.Acquire(me, 0, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.SetHolder(c.Process.Pid); err != nil {
			b.Fatal(err)
		}
		l.Release()
	}
}
