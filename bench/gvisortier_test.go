package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/runtime/gvisor"
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
// checked while it is live), one from an image root, a live native one and
// runsc's own exec, all in the same run, with every sample successful.
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

	f := GVisorExecFigure(srv.peer(), gv, DetectPeers(Options{}), []string{"/bin/true"}, 2, srv.gvisorImagePeer(buildAirlock(t)))
	if f.Name != "gvisor exec" || len(f.Results) != 4 {
		t.Fatalf("figure %+v", f)
	}
	for _, r := range f.Results {
		if r.Missing != "" || r.Error != "" || len(r.Samples) != 2 {
			t.Errorf("%s: %+v", r.Peer, r)
		}
	}
}

// gvisorServer starts airlock serve for a gvisor figure test, or skips.
func gvisorServer(t *testing.T) *apiServer {
	t.Helper()
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
	t.Cleanup(func() { os.RemoveAll(scratch) })
	srv, err := startServer(buildAirlock(t), scratch, 8, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.stop)
	return srv
}

// TestGVisorPauseFigures: the pause and resume figures time every round
// of a gvisor sandbox holding 100 MB in its Python session, report its
// cgroup memory while paused (far below the 100 MB), and find the
// session's bytes intact after the rounds.
func TestGVisorPauseFigures(t *testing.T) {
	srv := gvisorServer(t)
	figs := srv.GVisorPauseFigures(DetectPeers(Options{}), 2, PauseSessionSizes[0])
	if len(figs) != 2 || figs[0].Name != "gvisor pause (100 MB Python)" || figs[1].Name != "gvisor resume (100 MB Python)" {
		t.Fatalf("figures %+v", figs)
	}
	for _, f := range figs {
		r := f.Result(Reference)
		if r == nil || r.Error != "" || len(r.Samples) != 2 {
			t.Fatalf("%s: %+v", f.Name, r)
		}
	}
	var before, paused float64
	if _, err := fmt.Sscanf(figs[0].Result(Reference).Detail, "sandbox cgroup memory %f MiB before the first pause, median %f MiB while paused", &before, &paused); err != nil {
		t.Fatalf("detail %q: %v", figs[0].Result(Reference).Detail, err)
	}
	if before < 100 || paused > 50 {
		t.Fatalf("memory before %.1f MiB, while paused %.1f MiB: the pause did not free the session", before, paused)
	}
	if list, err := srv.c.List(context.Background(), nil); err != nil || len(list) != 0 {
		t.Fatalf("sandboxes left: %+v %v", list, err)
	}
}

// TestGVisorDensityFigure: the gvisor density figure measures idle gvisor
// sandboxes of airlock serve (runsc run, sentry and gofer, with the
// kernel memory of the sandbox's cgroup) and runsc's own detached
// containers in the same run, every one alive and answering an exec.
func TestGVisorDensityFigure(t *testing.T) {
	srv := gvisorServer(t)
	f := srv.GVisorDensityFigure(DetectPeers(Options{}), []string{"/bin/sleep", "3600"}, DensityOptions{Max: 2})
	if f.Name != "gvisor density" || len(f.Results) != 2 {
		t.Fatalf("figure %+v", f)
	}
	for _, r := range f.Results {
		if r.Missing != "" || r.Error != "" || r.Density == nil || r.Density.Alive != 2 || r.Density.ExecAnswered != 2 {
			t.Fatalf("%s: %+v", r.Peer, r)
		}
		// The sentry and gofer are counted with their cgroup's kernel
		// memory, not just the process that waits for them.
		if strings.HasPrefix(r.Density.KernelSource, "none") || r.Density.Processes < 3 {
			t.Errorf("%s: %+v", r.Peer, r.Density)
		}
	}
}

// TestDensityCountsAddressSpacesOnce: gVisor's systrap stubs share one
// address space (clone with CLONE_VM) and each reports its whole PSS; the
// density cost counts it once, so it is less than the naive sum over the
// sandbox's processes.
func TestDensityCountsAddressSpacesOnce(t *testing.T) {
	srv := gvisorServer(t)
	idle, err := startSettled(srv.gvisorPeer(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Stop()
	if idle.Cgroup == "" {
		t.Fatal("no cgroup for the gvisor sandbox")
	}
	pids := append(cgroupProcs(idle.Cgroup), descendants(idle.Root)...)
	shared := false
	var naive int64
	seen := map[int]bool{}
	for i, p := range pids {
		if seen[p] {
			continue
		}
		seen[p] = true
		if pss, _, ok := smapsRollup(p); ok {
			naive += pss
		}
		for _, q := range pids[i+1:] {
			if q != p && sameMM(p, q) {
				shared = true
			}
		}
	}
	if !shared {
		t.Fatalf("no two processes of the gvisor sandbox (%v) share an address space", pids)
	}
	if c := measureSandbox(idle, memCgroup(os.Getpid())); c.pss <= 0 || c.pss >= naive {
		t.Fatalf("measured pss %d, naive sum %d: the shared address space is not counted once", c.pss, naive)
	}
}

// TestGVisorForkFigure: the fork figure times every round of 3 forks from
// one snapshot until each answers an exec, reports the memory they add,
// and leaves no sandbox behind.
func TestGVisorForkFigure(t *testing.T) {
	srv := gvisorServer(t)
	f := srv.GVisorForkFigure(DetectPeers(Options{}), 2, 3)
	r := f.Result(Reference)
	if f.Unavailable != "" || r == nil || r.Error != "" || len(r.Samples) != 2 {
		t.Fatalf("fork figure: %+v", f)
	}
	if !strings.Contains(r.Detail, "memory added per fork") {
		t.Fatalf("fork figure detail %q", r.Detail)
	}
	t.Logf("%s: median %.0f ms; %s", f.Name, r.Median, r.Detail)
	if list, err := srv.c.List(context.Background(), nil); err != nil || len(list) != 0 {
		t.Fatalf("sandboxes left: %+v %v", list, err)
	}
}
