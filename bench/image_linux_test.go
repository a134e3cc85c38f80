package bench

import (
	"os"
	"strings"
	"testing"
)

// TestImageCreateFigure: the image figure measures a create from a
// one-layer busybox image and one from the default root in the same run,
// every round of both succeeding, and leaves nothing mounted.
func TestImageCreateFigure(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("image roots need root")
	}
	if _, err := os.Stat(busyboxPath); err != nil {
		t.Skip("needs busybox-static (scripts/setup.sh installs it)")
	}
	scratch := t.TempDir()
	f := ImageCreateFigure(scratch, 3)
	if f.Unavailable != "" || len(f.Results) != 2 || f.Results[0].Peer != Reference || f.Results[1].Peer != ImageDefaultPeer {
		t.Fatalf("figure %+v", f)
	}
	for _, r := range f.Results {
		if r.Missing != "" || r.Error != "" || len(r.Samples) != 3 {
			t.Errorf("%s: %+v", r.Peer, r)
		}
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), scratch) {
		t.Errorf("mounts left under %s:\n%s", scratch, mi)
	}
}

// TestGVisorImageCreateFigure: the gvisor image figure measures a gVisor
// create from the busybox image and one from the default root in the same
// run, every round of both succeeding, and leaves nothing mounted.
func TestGVisorImageCreateFigure(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("image roots need root")
	}
	if _, err := os.Stat(busyboxPath); err != nil {
		t.Skip("needs busybox-static (scripts/setup.sh installs it)")
	}
	scratch := t.TempDir()
	f := GVisorImageCreateFigure(scratch, 5)
	if f.Unavailable != "" {
		t.Skipf("unavailable: %s", f.Unavailable)
	}
	if len(f.Results) != 2 || f.Results[0].Peer != Reference || f.Results[1].Peer != ImageDefaultPeer {
		t.Fatalf("figure %+v", f)
	}
	for _, r := range f.Results {
		if r.Missing != "" || r.Error != "" || len(r.Samples) != 5 {
			t.Errorf("%s: %+v", r.Peer, r)
		}
		t.Logf("%s: samples %v ms", r.Peer, r.Samples)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), scratch) {
		t.Errorf("mounts left under %s:\n%s", scratch, mi)
	}
}
