package native_test

import (
	"context"
	"testing"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

// underTest is the runtime the shared helpers (run, sh, startSB, probeIn)
// start sandboxes with: native, or gvisor while TestGVisor re-runs the
// runtime-neutral tests.
var underTest = policy.RuntimeNative

// runIn is native.Run or gvisor.Run, per underTest.
func runIn(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error) {
	if underTest == policy.RuntimeGVisor {
		cfg.Policy.Runtime = policy.RuntimeGVisor
		return gvisor.Run(ctx, cfg, opts)
	}
	return native.Run(ctx, cfg, opts)
}

// testSandbox is what the tests need of a started sandbox of either runtime.
type testSandbox interface {
	Stats() (cgroups.Stats, error)
	Destroy() error
}

// startIn is native.Start or gvisor.Start, per underTest.
func startIn(cfg native.Config) (testSandbox, error) {
	if underTest == policy.RuntimeGVisor {
		cfg.Policy.Runtime = policy.RuntimeGVisor
		sb, err := gvisor.Start(cfg)
		if err != nil {
			return nil, err
		}
		return sb, nil
	}
	sb, err := native.Start(cfg)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

// pidsCap is the number of host tasks the sandbox's cgroup allows for p.
func pidsCap(p policy.Policy) int64 {
	if underTest == policy.RuntimeGVisor {
		return p.Limits.Pids + gvisor.PidsOverhead
	}
	return p.Limits.Pids
}

// TestGVisor runs this package's runtime-neutral tests again with
// runtime: gvisor (the same assertions, checked from the host). It is
// skipped only when runsc is not installed (scripts/setup.sh installs it).
// TestInodeFill is not among them: runsc drops tmpfs's nr_inodes, so under
// gVisor an inode flood is stopped by the memory limit instead
// (runtime/gvisor's TestInodeFloodHitsMemoryLimit); nor is TestInt80:
// gVisor answers a 32-bit system call with ENOSYS instead of killing the
// process (runtime/gvisor's TestInt80Refused).
func TestGVisor(t *testing.T) {
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	underTest = policy.RuntimeGVisor
	t.Cleanup(func() { underTest = policy.RuntimeNative })
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"RunEcho", TestRunEcho}, {"Python", TestPython}, {"CommandNotFound", TestCommandNotFound},
		{"HostFilesInvisible", TestHostFilesInvisible}, {"CannotWriteOutside", TestCannotWriteOutside},
		{"NoNetwork", TestNoNetwork}, {"Timeout", TestTimeout}, {"DoubleForkKilled", TestDoubleForkKilled},
		{"ForkBomb", TestForkBomb}, {"MemoryBomb", TestMemoryBomb}, {"DiskFill", TestDiskFill},
		{"CPUQuota", TestCPUQuota}, {"OutputFlood", TestOutputFlood},
		{"NoWritableCgroupfs", TestNoWritableCgroupfs}, {"SetuidBinaryGainsNothing", TestSetuidBinaryGainsNothing},
		{"Mounts", TestMounts}, {"HiddenPaths", TestHiddenPaths}, {"Rlimits", TestRlimits}, {"WorkdirAndEnv", TestWorkdirAndEnv},
		{"HomeUser", TestHomeUser}, {"MountsUnderTmpfs", TestMountsUnderTmpfs},
	} {
		t.Run(tc.name, tc.f)
	}
}
