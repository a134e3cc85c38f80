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

// TestKeysCreateLimits: keys create records the key's own ceilings and
// keys list shows them.
func TestKeysCreateLimits(t *testing.T) {
	state := t.TempDir()
	if _, errOut, code := runCLI(t, nil, "keys", "create", "--name", "small", "--max-pids", "64", "--max-memory", "256M",
		"--max-cpus", "0.5", "--max-disk", "64M", "--max-timeout", "90s", "--state-dir", state); code != 0 {
		t.Fatalf("create: %d %q", code, errOut)
	}
	if _, errOut, code := runCLI(t, nil, "keys", "create", "--name", "plain", "--state-dir", state); code != 0 {
		t.Fatalf("create: %d %q", code, errOut)
	}
	out, errOut, code := runCLI(t, nil, "keys", "list", "--state-dir", state)
	if code != 0 || !strings.Contains(out, "memory 256M, cpus 0.5, pids 64, disk 64M, timeout 1m30s") {
		t.Fatalf("list: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, nil, "keys", "create", "--name", "bad", "--max-pids", "-1", "--state-dir", state); code == 0 || !strings.Contains(errOut, "negative") {
		t.Errorf("negative key limit: %d %q", code, errOut)
	}
}

// TestServeCeilingAboveHost: a server refuses to promise more than its host
// has.
func TestServeCeilingAboveHost(t *testing.T) {
	_, errOut, code := runCLI(t, nil, "serve", "--state-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--max-cpus", "4096")
	if code == 0 || !strings.Contains(errOut, "ceiling cpus 4096 is above this host's") {
		t.Fatalf("serve --max-cpus 4096: exit %d, stderr %q", code, errOut)
	}
}
