package cgroups

import (
	"fmt"
	"os"
	"os/exec"
	"sort"
	"testing"
	"time"
)

// benchLimits are typical sandbox limits.
var benchLimits = Limits{MemoryBytes: 256 << 20, CPUs: 1, Pids: 64}

// What the timed Create/Add/Destroy cycle has in its group.
const (
	noProcess     = iota // an empty group: Create+Destroy
	liveProcess          // a sleeping process that Destroy must kill
	exitedProcess        // a process added, then killed and reaped untimed
)

func runCycle(b *testing.B, h *host, l Limits, mode int) {
	b.Helper()
	// Processes are started (and later killed and reaped) outside the
	// timed region, all at once, so that StopTimer's stop-the-world
	// bookkeeping does not land in every iteration.
	var cmds []*exec.Cmd
	if mode != noProcess {
		for i := 0; i < b.N; i++ {
			cmd := exec.Command("/bin/sleep", "60")
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			cmds = append(cmds, cmd)
		}
		defer func() {
			for _, c := range cmds {
				c.Process.Kill()
				c.Wait()
			}
		}()
	}
	groups := make([]*Group, b.N)
	per := make([]time.Duration, b.N)
	create := func(i int) {
		g, err := h.create(fmt.Sprintf("bench-%d-%d", os.Getpid(), i), l)
		if err != nil {
			b.Fatal(err)
		}
		if mode != noProcess {
			if err := g.Add(cmds[i].Process.Pid); err != nil {
				b.Fatal(err)
			}
		}
		groups[i] = g
	}
	destroy := func(i int) {
		if err := groups[i].Destroy(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	if mode == exitedProcess {
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			create(i)
			per[i] = time.Since(t0)
		}
		b.StopTimer()
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
		cmds = nil
		b.StartTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			destroy(i)
			per[i] += time.Since(t0)
		}
	} else {
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			create(i)
			destroy(i)
			per[i] = time.Since(t0)
		}
	}
	b.StopTimer()
	// The median resists the noise of other work on a shared machine.
	sort.Slice(per, func(i, j int) bool { return per[i] < per[j] })
	b.ReportMetric(float64(per[len(per)/2].Nanoseconds()), "p50-ns/op")
	b.ReportMetric(float64(per[len(per)*9/10].Nanoseconds()), "p90-ns/op")
}

func detectedHost(b *testing.B) *host {
	b.Helper()
	h := current()
	if h.info.Version == 0 || os.Geteuid() != 0 {
		b.Skipf("needs usable cgroups as root: %+v", h.info)
	}
	return h
}

// BenchmarkCreateDestroy measures the per-sandbox cost on the detected host
// setup with typical limits: Create+Destroy of an empty group; Create, Add
// of a live process and Destroy (which kills it and waits until the group
// is empty, so it includes the kernel's process exit); and Create+Add+
// Destroy where the process has already exited. Starting, killing and
// reaping the process itself is not timed. Besides ns/op it reports the
// median and 90th percentile of single cycles.
func BenchmarkCreateDestroy(b *testing.B) {
	h := detectedHost(b)
	b.Run("empty", func(b *testing.B) { runCycle(b, h, benchLimits, noProcess) })
	b.Run("live", func(b *testing.B) { runCycle(b, h, benchLimits, liveProcess) })
	b.Run("exited", func(b *testing.B) { runCycle(b, h, benchLimits, exitedProcess) })
}

// BenchmarkCreateDestroyV2 runs the same cycles on the machine's cgroup2
// mount (on the hybrid dev host it has no memory/pids/cpu controllers, so
// no limits are set: it measures mkdir, cgroup.procs, cgroup.kill and
// rmdir).
func BenchmarkCreateDestroyV2(b *testing.B) {
	h := unifiedHost(b, true)
	var l Limits
	if h.info.Has("memory") && h.info.Has("pids") && h.info.Has("cpu") {
		l = benchLimits
	}
	b.Run("empty", func(b *testing.B) { runCycle(b, h, l, noProcess) })
	b.Run("live", func(b *testing.B) { runCycle(b, h, l, liveProcess) })
	b.Run("exited", func(b *testing.B) { runCycle(b, h, l, exitedProcess) })
}
