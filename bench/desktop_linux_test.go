package bench

import (
	"os"
	"testing"

	"github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// TestDesktopFigures: the desktop figures measure, through `airlock serve
// --pool 1 --pool-image desktop`, a create from the warm pool to the first
// screenshot against one that is not pooled, and a full and a scaled
// screenshot, every round succeeding; E2B Desktop is reported missing
// with the reason. Timings are reported, never asserted.
func TestDesktopFigures(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("sandboxes from images need root")
	}
	// A short scratch directory: the server's agent sockets live under it.
	scratch, err := os.MkdirTemp("", "dsk")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(scratch)
	figs := DesktopFigures(testserver.Binary(t), scratch, imagetest.CacheDir(), 2, 0, t.Logf)
	if len(figs) != 2 {
		t.Fatalf("figures %+v", figs)
	}
	want := [][]string{{Reference, DesktopColdPeer, E2BDesktopPeer}, {Reference, DesktopScaledPeer, E2BDesktopPeer}}
	for i, f := range figs {
		if f.Unavailable != "" || len(f.Results) != 3 {
			t.Fatalf("%s: %+v", f.Name, f)
		}
		for j, r := range f.Results {
			if r.Peer != want[i][j] {
				t.Errorf("%s: peer %d is %q, want %q", f.Name, j, r.Peer, want[i][j])
			}
			if r.Peer == E2BDesktopPeer {
				if r.Missing == "" {
					t.Errorf("%s: E2B Desktop not reported missing: %+v", f.Name, r)
				}
				continue
			}
			if r.Missing != "" || r.Error != "" || len(r.Samples) != f.Rounds {
				t.Errorf("%s: %s: %+v", f.Name, r.Peer, r)
			}
			t.Logf("%s: %s: samples %v ms", f.Name, r.Peer, r.Samples)
		}
	}
}
