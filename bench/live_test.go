package bench

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestLiveFigures starts airlock serve and measures the figures that go
// through its API on a small scale, checking their shape, not their values.
func TestLiveFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("airlock serve needs cgroups: run as root on Linux")
	}
	srv, err := startServer(buildAirlock(t), t.TempDir(), 8, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	bare := DetectPeers(Options{})[0]
	peers := []Peer{srv.peer(), bare, {Name: "bwrap", Run: bare.Run}}
	wantSamples := func(f Figure, peer string, n int) {
		t.Helper()
		r := f.Result(peer)
		if r == nil || len(r.Samples) != n || r.Error != "" {
			t.Errorf("%s: %s: %+v, want %d samples", f.Name, peer, r, n)
		}
	}

	f := ExecFigure(peers, []string{"/bin/true"}, 2)
	wantSamples(f, Reference, 2)
	wantSamples(f, "bare", 2)
	if r := f.Result("bwrap"); r.Missing != noExec {
		t.Errorf("exec: a peer without exec is not missing: %+v", r)
	}

	f = LiveStartFigure(peers[:1], []string{"/bin/true"}, 2)
	wantSamples(f, Reference, 2)

	f = ThroughputFigure(peers[:2], []string{"/bin/true"}, 1, 2, 200*time.Millisecond)
	wantSamples(f, Reference, 1)
	if f.Unit != UnitPerSecond || f.Results[0].Median <= 0 {
		t.Errorf("throughput: %+v", f)
	}

	// Concurrent creates: two clients, two rounds; a latency figure with
	// its percentiles and a throughput figure per level.
	cf := ConcurrentCreateFigures(append(peers[:1], Peer{Name: "bwrap", Run: bare.Run}), []string{"/bin/true"}, []int{2}, 2)
	if len(cf) != 2 || cf[0].Unit != UnitMS || cf[1].Unit != UnitCreatesPerSecond {
		t.Fatalf("concurrent creates: %+v", cf)
	}
	wantSamples(cf[0], Reference, 2)
	wantSamples(cf[1], Reference, 2)
	if r := cf[0].Result(Reference); !strings.Contains(r.Detail, "over 4 creates: p50") {
		t.Errorf("concurrent creates: detail %q", r.Detail)
	}
	if r := cf[1].Result("bwrap"); r.Missing != noExec {
		t.Errorf("concurrent creates: a peer without exec is not missing: %+v", r)
	}

	f = Density(peers[:1], []string{"/bin/sleep", "600"}, DensityOptions{Max: 2})
	r := f.Result(Reference)
	if d := r.Density; d == nil || d.Started != 2 || d.Alive != 2 || d.ExecChecked != 2 || d.ExecAnswered != 2 || d.PSSMiB <= 0 {
		t.Errorf("density: %+v %+v", r, d)
	}
}
