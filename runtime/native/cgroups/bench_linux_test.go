package cgroups

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
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
	for i := 0; i < b.N; i++ {
		var cmd *exec.Cmd
		if mode != noProcess {
			b.StopTimer()
			cmd = exec.Command("/bin/sleep", "60")
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		g, err := h.create(fmt.Sprintf("bench-%d-%d", os.Getpid(), i), l)
		if err != nil {
			b.Fatal(err)
		}
		if cmd != nil {
			if err := g.Add(cmd.Process.Pid); err != nil {
				b.Fatal(err)
			}
		}
		if mode == exitedProcess {
			b.StopTimer()
			cmd.Process.Kill()
			cmd.Wait()
			b.StartTimer()
		}
		if err := g.Destroy(); err != nil {
			b.Fatal(err)
		}
		if mode == liveProcess {
			b.StopTimer()
			cmd.Wait()
			b.StartTimer()
		}
	}
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
// reaping the process itself is not timed.
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
