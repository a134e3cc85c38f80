package main

import (
	"strings"
	"testing"
)

// TestRunLimitsRefused (issue 15 CLI item, issue 20 finding 5): limits
// that are not positive or that the host cannot honour are refused with
// an error naming the limit and the ceiling, before any sandbox starts.
func TestRunLimitsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--cpus", "0"}, "cpus 0: must be greater than 0"},
		{[]string{"--pids", "0"}, "pids 0: must be greater than 0"},
		{[]string{"--pids", "-3"}, "pids -3: must be greater than 0"},
		{[]string{"--disk", "1T"}, "disk_bytes 1099511627776 (1.0 TiB) is above the ceiling of this host"},
		{[]string{"--memory", "1T"}, "memory_bytes 1099511627776 (1.0 TiB) is above the ceiling of this host"},
		{[]string{"--cpus", "4096"}, "cpus 4096 is above the ceiling of this host"},
		{[]string{"--pids", "4194304"}, "pids 4194304 is above the ceiling of this host"},
	} {
		out, errOut, code := runCLI(t, nil, append(append([]string{"run"}, c.args...), "--", "echo", "ran")...)
		if code != exitUsage || strings.Contains(out, "ran") || !strings.Contains(errOut, c.want) {
			t.Errorf("run %v: code %d out %q err %q, want exit %d and %q", c.args, code, out, errOut, exitUsage, c.want)
		}
	}
	if out, errOut, code := runCLI(t, nil, "run", "--cpus", "0.5", "--pids", "32", "--", "echo", "ran"); code != 0 || out != "ran\n" {
		t.Errorf("modest limits: code %d out %q err %q", code, out, errOut)
	}
}
