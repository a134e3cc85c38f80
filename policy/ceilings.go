package policy

import (
	"errors"
	"fmt"
	"strconv"
)

// Ceilings are the largest resource limits a sandbox may be given: the
// host's (HostCeilings), a server's (its flags) or an API key's. A zero
// field sets no ceiling.
type Ceilings struct {
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
	DiskBytes   int64   `json:"disk_bytes,omitempty"`
}

// DefaultMaxPids is the host ceiling on a sandbox's processes (also bounded
// by the kernel's pid_max).
const DefaultMaxPids = 32768

// CeilingError is a limit above a ceiling, or not positive.
type CeilingError struct {
	Field   string // the limit's JSON name, e.g. "memory_bytes"
	Value   string
	Ceiling string // empty when the value is not positive
	Whose   string // e.g. "this server", "this API key", "this host"
}

func (e *CeilingError) Error() string {
	if e.Ceiling == "" {
		return fmt.Sprintf("%s %s: must be greater than 0", e.Field, e.Value)
	}
	return fmt.Sprintf("%s %s is above the ceiling of %s: %s", e.Field, e.Value, e.Whose, e.Ceiling)
}

// Check refuses limits that are not positive or that exceed a ceiling,
// naming each field and its ceiling. whose says whose ceilings these are.
func (c Ceilings) Check(l Limits, whose string) error {
	var errs []error
	intCheck := func(field string, v, max int64, unit func(int64) string) {
		switch {
		case v <= 0:
			errs = append(errs, &CeilingError{Field: field, Value: strconv.FormatInt(v, 10)})
		case max > 0 && v > max:
			errs = append(errs, &CeilingError{Field: field, Value: unit(v), Ceiling: unit(max), Whose: whose})
		}
	}
	intCheck("memory_bytes", l.MemoryBytes, c.MemoryBytes, bytesText)
	intCheck("disk_bytes", l.DiskBytes, c.DiskBytes, bytesText)
	intCheck("pids", l.Pids, c.Pids, func(n int64) string { return strconv.FormatInt(n, 10) })
	cpus := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	switch {
	case !(l.CPUs > 0): // also NaN
		errs = append(errs, &CeilingError{Field: "cpus", Value: cpus(l.CPUs)})
	case c.CPUs > 0 && l.CPUs > c.CPUs:
		errs = append(errs, &CeilingError{Field: "cpus", Value: cpus(l.CPUs), Ceiling: cpus(c.CPUs), Whose: whose})
	}
	return errors.Join(errs...)
}

// Min returns, field by field, the tighter of c and o (a zero field of
// either sets no ceiling).
func (c Ceilings) Min(o Ceilings) Ceilings {
	minPos := func(a, b int64) int64 {
		if a == 0 || (b != 0 && b < a) {
			return b
		}
		return a
	}
	out := Ceilings{MemoryBytes: minPos(c.MemoryBytes, o.MemoryBytes), Pids: minPos(c.Pids, o.Pids),
		DiskBytes: minPos(c.DiskBytes, o.DiskBytes), CPUs: c.CPUs}
	if out.CPUs == 0 || (o.CPUs != 0 && o.CPUs < out.CPUs) {
		out.CPUs = o.CPUs
	}
	return out
}

// bytesText shows a byte count exactly, with a binary-unit reading.
func bytesText(n int64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	f, u := float64(n), ""
	for i := 0; f >= 1024 && i < len(units); i++ {
		f /= 1024
		u = units[i]
	}
	if u == "" {
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("%d (%.1f %s)", n, f, u)
}
