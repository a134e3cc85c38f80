package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// GVisorFigure measures the gvisor tier's cold start: `airlock run
// --runtime gvisor -- /bin/true`, exec'ed like the cold start figure,
// against runsc's own `run` of the same command (the runsc peer among
// peers) in the same run.
func GVisorFigure(exe string, peers []Peer, runs int, timeout time.Duration) Figure {
	if timeout <= 0 {
		timeout = time.Minute
	}
	cli := Peer{Name: Reference, Note: "airlock run --runtime gvisor -- CMD (the whole CLI, exec'ed: Go start, strict policy, OCI bundle from the root template, runsc run, teardown)"}
	if _, err := gvisor.Available(); err != nil {
		cli.Missing = err.Error()
	} else if exe == "" {
		cli.Missing = "airlock binary unknown"
	} else {
		cli.Run = func(argv []string) error {
			return runWith(timeout, runSpec{}, exe, append([]string{"run", "--runtime", "gvisor", "--"}, argv...)...)
		}
	}
	runsc := Peer{Name: "runsc", Missing: "runsc not found"}
	for _, p := range peers {
		if p.Name == "runsc" {
			runsc = p
		}
	}
	f := Alternate([]Peer{cli, runsc}, []string{"/bin/true"}, runs)
	f.Name = "gvisor cold start"
	return f
}

// GVisorImagePeer is the name of the airlock peer whose live sandboxes run
// under the gvisor tier from an image root.
const GVisorImagePeer = Reference + " gvisor image"

// GVisorExecFigure times argv run in a live gvisor sandbox of airlock serve
// (POST /v1/sandboxes with "runtime": "gvisor", then exec through the API)
// against a live native sandbox of the same server and runsc's own exec
// into a detached container (the runsc peer among others), in the same
// run. api is the server's native peer, gv its gvisor peer.
func GVisorExecFigure(api, gv Peer, others []Peer, argv []string, runs int, extra ...Peer) Figure {
	if _, err := gvisor.Available(); err != nil && gv.Missing == "" {
		gv = Peer{Name: GVisorPeer, Missing: err.Error()}
	}
	runsc := Peer{Name: "runsc", Missing: "runsc not found"}
	for _, p := range others {
		if p.Name == "runsc" {
			runsc = p
		}
	}
	f := ExecFigure(append([]Peer{api, gv}, append(extra, runsc)...), argv, runs)
	f.Name = "gvisor exec"
	return f
}

// PauseSessionSizes are how much the Python session of the pause figures
// holds: os.urandom, so that no page is zero or compressible. 1 GiB is the
// size E2B publishes pause and resume figures for (~4 s/GiB, ~1 s).
var PauseSessionSizes = []int64{100 << 20, 1 << 30}

// sizeName renders a session size as the figures name it.
func sizeName(b int64) string {
	if b >= 1<<30 && b%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", b>>30)
	}
	return fmt.Sprintf("%d MB", b>>20)
}

// GVisorPauseFigures time pausing (runsc checkpoint to disk, memory freed)
// and resuming (runsc restore) a live gvisor sandbox of airlock serve whose
// Python context holds sessionBytes of random bytes, through the API: one
// pause and one resume per round. Only airlock pauses to disk behind an
// API, so the other peers are listed as missing. After the last round the
// session must still hold its bytes.
func (s *apiServer) GVisorPauseFigures(others []Peer, runs int, sessionBytes int64) []Figure {
	if _, err := gvisor.Available(); err != nil {
		size := sizeName(sessionBytes)
		return []Figure{Unavailable("gvisor pause ("+size+" Python)", err.Error()), Unavailable("gvisor resume ("+size+" Python)", err.Error())}
	}
	return s.pauseFigures(pauseTier{runtime: "gvisor", label: "gvisor",
		pause:  "POST /v1/sandboxes/{id}/pause: runsc checkpoint to disk, image synced and dropped from the page cache",
		resume: "POST /v1/sandboxes/{id}/resume: runsc restore, then the agent answers a ping"}, others, runs, sessionBytes)
}

// pauseTier names a tier's pause figures and says what its pause and
// resume do.
type pauseTier struct {
	runtime, label, pause, resume string
}

// pauseFigures are the pause and resume figures of tier t: see
// GVisorPauseFigures.
func (s *apiServer) pauseFigures(t pauseTier, others []Peer, runs int, sessionBytes int64) []Figure {
	const code = "import os, hashlib\nbig = os.urandom(%d)\nh = hashlib.sha256(big).hexdigest()"
	size := sizeName(sessionBytes)
	names := []string{t.label + " pause (" + size + " Python)", t.label + " resume (" + size + " Python)"}
	fail := func(why string) []Figure { return []Figure{Unavailable(names[0], why), Unavailable(names[1], why)} }
	// Every round takes a pause, a resume and a metrics read.
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout*time.Duration(3*runs+3))
	defer cancel()
	// Room for the bytes, their copy while hashing, and Python itself.
	sb, err := s.c.Create(ctx, client.CreateRequest{Runtime: t.runtime, Limits: &client.Limits{MemoryBytes: max(512<<20, 2*sessionBytes+256<<20)}})
	if err != nil {
		return fail("could not create a " + t.runtime + " sandbox: " + err.Error())
	}
	defer s.c.Kill(context.Background(), sb.ID)
	res, err := s.c.RunCode(ctx, sb.ID, client.CodeRequest{Code: fmt.Sprintf(code, sessionBytes)})
	if err == nil && res.Error != nil {
		err = fmt.Errorf("%s: %s", res.Error.Name, res.Error.Value)
	}
	if err != nil {
		return fail("could not fill the Python session: " + err.Error())
	}
	var before int64
	if m, err := s.c.Metrics(ctx, sb.ID); err == nil {
		before = m.MemoryBytes
	}
	why := "has no pause to disk behind an API"
	figs := []Figure{
		{Name: names[0], Unit: UnitMS, Rounds: runs, Results: codePeersResults(others, why, t.pause)},
		{Name: names[1], Unit: UnitMS, Rounds: runs, Results: codePeersResults(others, why, t.resume)},
	}
	for i := range figs {
		figs[i].Results[0].rounds = make([]float64, runs)
		for k := range figs[i].Results[0].rounds {
			figs[i].Results[0].rounds[k] = math.NaN()
		}
	}
	timed := func(f func(context.Context, string) (*client.Sandbox, error)) (float64, error) {
		ctx, cancel := s.ctx()
		defer cancel()
		start := time.Now()
		_, err := f(ctx, sb.ID)
		return float64(time.Since(start)) / float64(time.Millisecond), err
	}
	var paused []float64
	for i := 0; i < runs; i++ {
		ms, err := timed(s.c.Pause)
		if err != nil {
			figs[0].Results[0].fail(i, err)
			break
		}
		figs[0].Results[0].rounds[i] = ms
		if m, err := s.c.Metrics(ctx, sb.ID); err == nil {
			paused = append(paused, float64(m.MemoryBytes)/(1<<20))
		}
		if ms, err = timed(s.c.Resume); err != nil {
			figs[1].Results[0].fail(i, err)
			break
		}
		figs[1].Results[0].rounds[i] = ms
	}
	res, err = s.c.RunCode(ctx, sb.ID, client.CodeRequest{Code: fmt.Sprintf("len(big) == %d and hashlib.sha256(big).hexdigest() == h", sessionBytes)})
	if err == nil && res.Text != "True" {
		err = fmt.Errorf("the session's bytes changed over pause and resume: %q %+v", res.Text, res.Error)
	}
	for i := range figs {
		r := &figs[i].Results[0]
		if err != nil && r.Error == "" {
			r.Error = "after the rounds: " + err.Error()
		}
		figs[i].Command = []string{fmt.Sprintf(code, sessionBytes)}
		figs[i].summarise()
	}
	if len(paused) > 0 {
		figs[0].Results[0].Detail = fmt.Sprintf("sandbox cgroup memory %.1f MiB before the first pause, median %.2f MiB while paused", float64(before)/(1<<20), Median(paused))
	}
	figs[0].Note = "a live " + t.runtime + " sandbox whose Python context holds " + size + " of os.urandom bytes; each round pauses it (its state saved to disk, memory freed) and resumes it; the bytes' hash is checked after the last round"
	figs[1].Note = figs[0].Note
	return figs
}

// codePeersResults is codePeers as a figure's results: airlock (noted)
// first, the other peers missing with why.
func codePeersResults(others []Peer, why, note string) []PeerResult {
	ps := codePeers(note, others, why)
	rs := make([]PeerResult, len(ps))
	for i, p := range ps {
		rs[i] = PeerResult{Peer: p.Name, Note: p.Note, Missing: p.Missing}
	}
	return rs
}

// fail records a failed round.
func (r *PeerResult) fail(round int, err error) {
	r.Failures++
	if r.Error == "" {
		r.Error = fmt.Sprintf("round %d: %v", round+1, err)
	}
}

// GVisorDensityMax caps the gvisor density figure's sandboxes per peer
// (each gvisor sandbox costs tens of MiB and a few hundred ms to start).
const GVisorDensityMax = 10

// GVisorDensityFigure is the density figure for the gvisor tier: idle
// gvisor sandboxes of airlock serve (the agent as init under runsc, and
// the `runsc run` process that waits for it) against runsc's own detached
// containers (the runsc peer among others), in the same run.
func (s *apiServer) GVisorDensityFigure(others []Peer, argv []string, opts DensityOptions) Figure {
	gv := s.gvisorPeer()
	gv.Name = Reference
	if _, err := gvisor.Available(); err != nil {
		gv.Missing = err.Error()
	}
	runsc := Peer{Name: "runsc", Missing: "runsc not found"}
	for _, p := range others {
		if p.Name == "runsc" {
			runsc = p
		}
	}
	f := Density([]Peer{gv, runsc}, argv, opts)
	f.Name = "gvisor density"
	return f
}
