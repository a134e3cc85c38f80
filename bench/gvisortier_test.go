package bench

import (
	"os"
	"testing"

	"airlock/internal/testserver"
	"airlock/runtime/gvisor"
)

// TestGVisorFigure: the gvisor cold start figure measures airlock's gvisor
// tier and runsc's own run in the same run (both succeed), or reports why
// not.
func TestGVisorFigure(t *testing.T) {
	if _, err := gvisor.Available(); err != nil {
		f := GVisorFigure("", nil, 1, 0)
		if f.Results[0].Missing == "" {
			t.Fatalf("unavailable tier not reported: %+v", f)
		}
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("runsc runs as root")
	}
	f := GVisorFigure(testserver.Binary(t), DetectPeers(Options{}), 2, 0)
	if f.Name != "gvisor cold start" || len(f.Results) != 2 {
		t.Fatalf("figure %+v", f)
	}
	for _, r := range f.Results {
		if r.Missing != "" || r.Error != "" || len(r.Samples) != 2 {
			t.Errorf("%s: %+v", r.Peer, r)
		}
	}
}
