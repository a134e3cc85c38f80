package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

// BenchmarkSetupSteps times, each on its own, the steps a cold
// `airlock run -- /bin/true` is made of, so that docs/benchmarks.md can say
// where the milliseconds go:
//
//   - go-start: exec the airlock binary for `airlock version` (Go runtime
//     start, package init, exit), the CLI's fixed cost;
//   - policy: the strict preset and its validation;
//   - cgroup: create and destroy an empty sandbox cgroup with the strict
//     limits;
//   - clone/...: fork, exec /bin/true and wait in fresh namespaces (via
//     os/exec, uid 0 mapped to the caller in a user namespace): none, user,
//     user+mnt+pid, all but net, all;
//   - native/run: native.Run of /bin/true, the whole in-process cold start;
//   - native/phases: the same split into Start (policy to exec), Wait (the
//     program's run and exit) and Destroy (cgroup kill and removal),
//     reported as start-ms, wait-ms and destroy-ms per op.
func BenchmarkSetupSteps(b *testing.B) {
	b.Run("go-start", func(b *testing.B) {
		bin := buildAirlock(b)
		for i := 0; i < b.N; i++ {
			if out, err := exec.Command(bin, "version").CombinedOutput(); err != nil {
				b.Fatalf("%v: %s", err, out)
			}
		}
	})
	b.Run("policy", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			p, err := policy.Preset(policy.Strict)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Validate(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cgroup", func(b *testing.B) {
		if info := cgroups.Detect(); info.Version == 0 || info.Reason != "" {
			b.Skipf("cgroups unusable: %s", info.Reason)
		}
		p, _ := policy.Preset(policy.Strict)
		l := cgroups.Limits{MemoryBytes: p.Limits.MemoryBytes, CPUs: p.Limits.CPUs, Pids: p.Limits.Pids}
		for i := 0; i < b.N; i++ {
			g, err := cgroups.Create(fmt.Sprintf("bench-steps-%d-%d", os.Getpid(), i), l)
			if err != nil {
				b.Fatal(err)
			}
			if err := g.Destroy(); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, c := range []struct {
		name  string
		flags uintptr
	}{
		{"none", 0},
		{"user", syscall.CLONE_NEWUSER},
		{"user+mnt+pid", syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID},
		{"all-but-net", syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP},
		{"all", syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP | syscall.CLONE_NEWNET},
	} {
		b.Run("clone/"+c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				cmd := exec.Command("/bin/true")
				cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: c.flags}
				if c.flags&syscall.CLONE_NEWUSER != 0 {
					cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
					cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
				}
				if err := cmd.Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	strict, err := policy.Preset(policy.Strict)
	if err != nil {
		b.Fatal(err)
	}
	argv := []string{"/bin/true"}
	b.Run("native/run", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			res, err := native.Run(context.Background(), native.Config{Policy: strict, Args: argv}, native.RunOptions{})
			if err != nil || res.Status != native.StatusOK {
				b.Fatalf("%v %+v", err, res)
			}
		}
	})
	b.Run("native/phases", func(b *testing.B) {
		var start, wait, destroy time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			sb, err := native.Start(native.Config{Policy: strict, Args: argv})
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if _, err := sb.Wait(); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			if err := sb.Destroy(); err != nil {
				b.Fatal(err)
			}
			t3 := time.Now()
			start, wait, destroy = start+t1.Sub(t0), wait+t2.Sub(t1), destroy+t3.Sub(t2)
		}
		per := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(b.N) }
		b.ReportMetric(per(start), "start-ms/op")
		b.ReportMetric(per(wait), "wait-ms/op")
		b.ReportMetric(per(destroy), "destroy-ms/op")
	})
}
