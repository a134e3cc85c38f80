package manager

import "testing"

// TestNetLogRateLimit: a sandbox flooding refused connections is held to
// the burst, and the next written record says how many were dropped.
func TestNetLogRateLimit(t *testing.T) {
	m := &Manager{}
	written := 0
	for i := 0; i < netLogBurst+500; i++ {
		if _, ok := m.netLogAllow("sb-flood"); ok {
			written++
		}
	}
	if written > netLogBurst+5 || written < netLogBurst-5 {
		t.Fatalf("wrote %d records, want about the burst of %d", written, netLogBurst)
	}
	if _, ok := m.netLogAllow("sb-other"); !ok {
		t.Fatal("another sandbox was limited too")
	}
	b := m.netLog["sb-flood"]
	if b.dropped < 400 {
		t.Fatalf("dropped %d, want about 500 counted", b.dropped)
	}
}
