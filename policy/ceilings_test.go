package policy

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestCeilingsCheck(t *testing.T) {
	c := Ceilings{MemoryBytes: 24 << 30, CPUs: 2, Pids: 32768, DiskBytes: 24 << 30}
	p, _ := Preset(Strict)
	if err := c.Check(p.Limits, "this host"); err != nil {
		t.Fatalf("strict preset refused: %v", err)
	}
	huge := p.Limits
	huge.MemoryBytes, huge.DiskBytes, huge.Pids, huge.CPUs = 1<<40, 1<<40, 4194304, 1024
	err := c.Check(huge, "this server")
	for _, want := range []string{"memory_bytes 1099511627776 (1.0 TiB) is above the ceiling of this server: 25769803776 (24.0 GiB)",
		"disk_bytes", "pids 4194304 is above the ceiling of this server: 32768", "cpus 1024 is above the ceiling of this server: 2"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v: want %q", err, want)
		}
	}
	var ce *CeilingError
	if !errors.As(err, &ce) {
		t.Errorf("not a CeilingError: %T", err)
	}
	zero := p.Limits
	zero.CPUs, zero.Pids = 0, 0
	if err := c.Check(zero, "x"); err == nil || !strings.Contains(err.Error(), "cpus 0: must be greater than 0") || !strings.Contains(err.Error(), "pids 0") {
		t.Errorf("zero limits: %v", err)
	}
	nan := p.Limits
	nan.CPUs = math.NaN()
	if err := (Ceilings{}).Check(nan, "x"); err == nil {
		t.Error("NaN cpus accepted")
	}
	if got := c.Min(Ceilings{CPUs: 1, Pids: 64}); got != (Ceilings{MemoryBytes: 24 << 30, CPUs: 1, Pids: 64, DiskBytes: 24 << 30}) {
		t.Errorf("min: %+v", got)
	}
	if h, err := HostCeilings(); err != nil || h.MemoryBytes <= 0 || h.CPUs < 1 || h.Pids <= 0 {
		t.Errorf("host ceilings %+v %v", h, err)
	}
}
