package main

import (
	"flag"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/store"
)

// ceilingFlags are --max-memory, --max-cpus, --max-pids and --max-disk:
// ceilings on what a sandbox may ask for (airlock serve: the server's;
// airlock keys create: the key's own).
type ceilingFlags struct {
	memory, disk sizeFlag
	cpus         float64
	pids         int64
}

func (f *ceilingFlags) register(fs *flag.FlagSet, zero string) {
	fs.Var(&f.memory, "max-memory", "largest memory limit a sandbox may ask for, e.g. 8G (0: "+zero+")")
	fs.Var(&f.disk, "max-disk", "largest disk_bytes (size of /workspace and of /tmp, both in memory) a sandbox may ask for (0: "+zero+")")
	fs.Float64Var(&f.cpus, "max-cpus", 0, "largest CPU quota in cores a sandbox may ask for (0: "+zero+")")
	fs.Int64Var(&f.pids, "max-pids", 0, "largest process limit a sandbox may ask for (0: "+zero+")")
}

func (f *ceilingFlags) ceilings() policy.Ceilings {
	return policy.Ceilings{MemoryBytes: int64(f.memory), DiskBytes: int64(f.disk), CPUs: f.cpus, Pids: f.pids}
}

// keyLimits is the key's ceilings plus its largest TTL.
func (f *ceilingFlags) keyLimits(timeout time.Duration) store.KeyLimits {
	c := f.ceilings()
	return store.KeyLimits{MemoryBytes: c.MemoryBytes, CPUs: c.CPUs, Pids: c.Pids, DiskBytes: c.DiskBytes,
		TimeoutSeconds: int64((timeout + time.Second - 1) / time.Second)}
}

// keyLimitsText shows a key's own ceilings for keys list ("-": none, only
// the server's apply).
func keyLimitsText(l store.KeyLimits) string {
	var parts []string
	if l.MemoryBytes > 0 {
		parts = append(parts, "memory "+formatSize(l.MemoryBytes))
	}
	if l.CPUs > 0 {
		parts = append(parts, "cpus "+strconv.FormatFloat(l.CPUs, 'g', -1, 64))
	}
	if l.Pids > 0 {
		parts = append(parts, "pids "+strconv.FormatInt(l.Pids, 10))
	}
	if l.DiskBytes > 0 {
		parts = append(parts, "disk "+formatSize(l.DiskBytes))
	}
	if l.TimeoutSeconds > 0 {
		parts = append(parts, "timeout "+(time.Duration(l.TimeoutSeconds)*time.Second).String())
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
