package cgroups

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAttachAdvice: only cgroup v2 without favordynmods and without
// expedited RCU is reported slow, and then the advice names both fixes.
func TestAttachAdvice(t *testing.T) {
	for _, c := range []struct {
		version  int
		opts, rc string
		slow     bool
		want     string
	}{
		{1, "", "0", false, "moves itself"},
		{2, "rw,nsdelegate,favordynmods,memory_recursiveprot", "0", false, "with favordynmods"},
		{2, "rw,nsdelegate", "1", false, "expedited"},
		{2, "rw,nsdelegate", "0", true, "favordynmods"},
		{2, "rw,nsdelegate", "", true, "rcu_expedited"},
	} {
		detail, slow := attachAdvice(c.version, c.opts, c.rc)
		if slow != c.slow || !strings.Contains(detail, c.want) {
			t.Errorf("attachAdvice(%d, %q, %q) = %q, %v; want slow %v and %q", c.version, c.opts, c.rc, detail, slow, c.slow, c.want)
		}
	}
	mi := filepath.Join(t.TempDir(), "mountinfo")
	line := "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,favordynmods\n"
	if err := os.WriteFile(mi, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, err := readMounts(mi); err != nil || m.v2 != "/sys/fs/cgroup" || m.v2Opts != "rw,nsdelegate,favordynmods" {
		t.Fatalf("readMounts: v2 %q, options %q, %v", m.v2, m.v2Opts, err)
	}
	if detail, _ := AttachAdvice(); detail == "" {
		t.Fatal("AttachAdvice says nothing")
	}
}
