package native

import (
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
)

// rlimitsFor returns the rlimits of a sandbox: the third layer under
// cgroups and tmpfs sizes. When cgroups are unavailable, NPROC stands in for
// the pids limit (it counts per host uid, so it is only a fallback).
func rlimitsFor(l policy.Limits, cgroups bool) []rlimitOp {
	set := func(res int, v uint64) rlimitOp { return rlimitOp{res, unix.Rlimit{Cur: v, Max: v}} }
	cpu := uint64(l.CPUTime.Seconds())
	r := []rlimitOp{
		set(unix.RLIMIT_NOFILE, l.OpenFiles),
		set(unix.RLIMIT_FSIZE, uint64(l.FileSizeBytes)),
		set(unix.RLIMIT_CORE, 0),
		set(unix.RLIMIT_CPU, cpu),
		{unix.RLIMIT_STACK, unix.Rlimit{Cur: 8 << 20, Max: 64 << 20}},
		set(unix.RLIMIT_MEMLOCK, 64<<10),
		set(unix.RLIMIT_MSGQUEUE, 0),
		set(unix.RLIMIT_RTPRIO, 0),
		set(unix.RLIMIT_NICE, 0),
	}
	if !cgroups {
		r = append(r, set(unix.RLIMIT_NPROC, uint64(l.Pids)))
	}
	// Without CAP_SYS_RESOURCE a hard limit can only go down: clamp to
	// what the launcher has.
	for i := range r {
		var cur unix.Rlimit
		if unix.Getrlimit(r[i].resource, &cur) == nil {
			r[i].lim.Max = min(r[i].lim.Max, cur.Max)
			r[i].lim.Cur = min(r[i].lim.Cur, r[i].lim.Max)
		}
	}
	return r
}
