package policy

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// HostCeilings derives ceilings from this host: memory and disk (the
// sandbox's /workspace and /tmp are tmpfs, held in memory) at most the
// host's RAM, CPUs at most the CPUs this process may run on, processes at
// most DefaultMaxPids and half the kernel's pid_max.
func HostCeilings() (Ceilings, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return Ceilings{}, fmt.Errorf("host ceilings: sysinfo: %w", err)
	}
	mem := int64(si.Totalram) * int64(si.Unit)
	pids := int64(DefaultMaxPids)
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n/2 < pids {
			pids = n / 2
		}
	}
	return Ceilings{MemoryBytes: mem, DiskBytes: mem, CPUs: float64(runtime.NumCPU()), Pids: pids}, nil
}
