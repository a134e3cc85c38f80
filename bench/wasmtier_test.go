package bench

import "testing"

// TestWasmFigures: both wasm figures measure airlock (CLI and in-process)
// without error, and node:wasi when node is installed.
func TestWasmFigures(t *testing.T) {
	figs := WasmFigures(buildAirlock(t), t.TempDir(), 2, 0)
	if len(figs) != 2 {
		t.Fatalf("got %d figures: %+v", len(figs), figs)
	}
	for _, f := range figs {
		for _, r := range f.Results {
			if r.Missing == "" && (r.Error != "" || r.Median <= 0) {
				t.Errorf("%s / %s: error %q, median %g", f.Name, r.Peer, r.Error, r.Median)
			}
		}
		if r := f.Result(Reference); r == nil || r.Missing != "" || r.Error != "" {
			t.Errorf("%s: airlock not measured: %+v", f.Name, r)
		}
	}
}
