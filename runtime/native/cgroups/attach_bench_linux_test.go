package cgroups

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// quietSpell is how long each round waits, untimed, before its attach, so
// that the kernel's threadgroup lock is back on its fast path (an RCU
// grace period is a few milliseconds): every round is the first attach
// after a quiet spell, as in a cold `airlock run`.
const quietSpell = 100 * time.Millisecond

// BenchmarkAttachAfterQuiet compares the two ways a sandbox's init can
// join its group in every hierarchy, each after a quiet spell: "by-pid",
// Add (the pid written to cgroup.procs: the global threadgroup lock,
// whose first writer waits for an RCU grace period), and "self" (the
// moving thread writes "0" to the tasks files OpenTasks returns: what
// native.Start's child does on cgroup v1). Use -benchtime=20x; besides
// ns/op it reports the median (p50-ns/op) and the worst (max-ns/op).
func BenchmarkAttachAfterQuiet(b *testing.B) {
	h := detectedHost(b)
	if h.info.Version != 1 {
		b.Skip("the self move through tasks files is cgroup v1 only")
	}
	groups := [2]*Group{}
	for i := range groups {
		g, err := h.create(fmt.Sprintf("bench-attach-%d-%d", os.Getpid(), i), benchLimits)
		if err != nil {
			b.Fatal(err)
		}
		defer g.Destroy()
		groups[i] = g
	}
	b.Run("by-pid", func(b *testing.B) {
		cmd := exec.Command("/bin/sleep", "600")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		timeRounds(b, func(i int) error { return groups[i%2].Add(cmd.Process.Pid) })
	})
	b.Run("self", func(b *testing.B) {
		runtime.LockOSThread() // the thread is left to exit with the goroutine: never reused
		home, err := threadHome(h)
		if err != nil {
			b.Fatal(err)
		}
		files := [2][]int{}
		for i, g := range groups {
			if files[i], err = g.OpenTasks(); err != nil {
				b.Fatal(err)
			}
			defer closeAll(files[i])
		}
		timeRounds(b, func(i int) error {
			for _, fd := range files[i%2] {
				if _, err := unix.Write(fd, []byte("0")); err != nil {
					return err
				}
			}
			return nil
		})
		// Back where the thread was, so the groups can be removed.
		for _, p := range home {
			if err := writeFile(p, "0"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// timeRounds runs attach once per round after a quiet spell and reports
// the median and worst round.
func timeRounds(b *testing.B, attach func(i int) error) {
	b.Helper()
	per := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		time.Sleep(quietSpell)
		b.StartTimer()
		t0 := time.Now()
		if err := attach(i); err != nil {
			b.Fatal(err)
		}
		per[i] = time.Since(t0)
	}
	b.StopTimer()
	sort.Slice(per, func(i, j int) bool { return per[i] < per[j] })
	b.ReportMetric(float64(per[len(per)/2].Nanoseconds()), "p50-ns/op")
	b.ReportMetric(float64(per[len(per)-1].Nanoseconds()), "max-ns/op")
}

// threadHome lists the tasks files of the calling thread's own cgroups in
// the hierarchies the host uses.
func threadHome(h *host) ([]string, error) {
	raw, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	var home []string
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[1] == "" {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if dir, ok := h.v1[c]; ok {
				// dir is MOUNT/airlock: the mount is its parent.
				home = append(home, strings.TrimSuffix(dir, "/airlock")+f[2]+"/tasks")
				break
			}
		}
	}
	if len(home) == 0 {
		return nil, fmt.Errorf("no v1 hierarchy of %v in /proc/thread-self/cgroup: %q", h.v1, raw)
	}
	return home, nil
}
