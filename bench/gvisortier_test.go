package bench

import (
	"context"
	"os"
	"testing"
	"time"

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

// TestGVisorExecFigure: the gvisor exec figure runs /bin/true in a live
// gvisor sandbox of airlock serve (the server says its runtime is gvisor,
// checked while it is live), a live native one and runsc's own exec, all
// in the same run, with every sample successful.
func TestGVisorExecFigure(t *testing.T) {
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("airlock serve needs cgroups and runsc runs as root")
	}
	scratch, err := os.MkdirTemp("", "bg") // short: the agent's socket path is limited
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(scratch)
	srv, err := startServer(buildAirlock(t), scratch, 8, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	gv := srv.gvisorPeer()
	idle, err := gv.StartIdle(nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := srv.c.List(context.Background(), nil)
	if err != nil || len(list) != 1 || list[0].Runtime != "gvisor" {
		t.Fatalf("the gvisor peer's live sandbox: %+v %v", list, err)
	}
	if err := idle.Stop(); err != nil {
		t.Fatal(err)
	}

	f := GVisorExecFigure(srv.peer(), gv, DetectPeers(Options{}), []string{"/bin/true"}, 2)
	if f.Name != "gvisor exec" || len(f.Results) != 3 {
		t.Fatalf("figure %+v", f)
	}
	for _, r := range f.Results {
		if r.Missing != "" || r.Error != "" || len(r.Samples) != 2 {
			t.Errorf("%s: %+v", r.Peer, r)
		}
	}
}
