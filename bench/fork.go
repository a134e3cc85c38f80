package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// ForkN is how many sandboxes the fork figure starts from one snapshot.
const ForkN = 10

// forkSessionBytes is what the original's Python session holds.
const forkSessionBytes = 100 << 20

// GVisorForkFigure times forking n gvisor sandboxes at once from one
// memory snapshot of a live one (its Python session holding 100 MB of
// random bytes) until every fork has answered an exec, through the API;
// its Detail says what memory the forks add (the PSS of their processes,
// so pages they share are counted once) against the original's. Only
// airlock forks from a snapshot behind an API; the other peers are listed
// as missing.
func (s *apiServer) GVisorForkFigure(others []Peer, runs, n int) Figure {
	name := fmt.Sprintf("gvisor fork x%d (100 MB Python)", n)
	if _, err := gvisor.Available(); err != nil {
		return Unavailable(name, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout*time.Duration(2*runs+4))
	defer cancel()
	sb, err := s.c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Limits: &client.Limits{MemoryBytes: 512 << 20}})
	if err != nil {
		return Unavailable(name, "could not create a gvisor sandbox: "+err.Error())
	}
	defer s.c.Kill(context.Background(), sb.ID)
	res, err := s.c.RunCode(ctx, sb.ID, client.CodeRequest{Code: fmt.Sprintf("import os\nbig = os.urandom(%d)", forkSessionBytes)})
	if err == nil && res.Error != nil {
		err = fmt.Errorf("%s: %s", res.Error.Name, res.Error.Value)
	}
	if err != nil {
		return Unavailable(name, "could not fill the Python session: "+err.Error())
	}
	snap, err := s.c.MemorySnapshot(ctx, sb.ID)
	if err != nil {
		return Unavailable(name, "could not snapshot the sandbox: "+err.Error())
	}
	self := memCgroup(os.Getpid())
	var original cost
	if root, cg := s.runscPid(sb.ID); root != 0 {
		original = measureSandbox(&Idle{Root: root, Cgroup: cg}, self)
	}

	fig := Figure{Name: name, Unit: UnitMS, Rounds: runs, Results: codePeersResults(others, "has no fork from a memory snapshot behind an API",
		fmt.Sprintf("POST /v1/sandboxes/{id}/snapshots once, then %d concurrent POST /v1/sandboxes {\"runtime\":\"gvisor\",\"snapshot\":ID} (runsc restore), each until an exec of /bin/true answers", n))}
	r := &fig.Results[0]
	r.rounds = make([]float64, runs)
	var added []float64
	for round := range runs {
		r.rounds[round] = math.NaN()
		ms, perFork, err := s.forkRound(snap.ID, n, self)
		if err != nil {
			r.fail(round, err)
			continue
		}
		r.rounds[round] = ms
		added = append(added, perFork)
	}
	fig.summarise()
	if len(added) > 0 {
		r.Detail = fmt.Sprintf("memory added per fork %.1f MiB (PSS of its processes: pages shared with the other forks counted once)", Median(added)/(1<<20))
		if original.pss > 0 {
			r.Detail += fmt.Sprintf(", %.0f%% of the original's %.1f MiB", 100*Median(added)/float64(original.pss), float64(original.pss)/(1<<20))
		}
	}
	fig.Note = fmt.Sprintf("a live gvisor sandbox whose Python context holds 100 MB of os.urandom bytes is snapshotted once; each round starts %d forks of it at once and ends when every fork has answered an exec; the forks are then measured and killed (not timed)", n)
	return fig
}

// forkRound starts n forks of snapshot at once and returns the time until
// all of them answered an exec, and the memory each adds (bytes).
func (s *apiServer) forkRound(snapshot string, n int, self string) (float64, float64, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ids   []string
		first error
	)
	defer func() {
		for _, id := range ids {
			ctx, cancel := s.ctx()
			s.c.Kill(ctx, id)
			cancel()
		}
	}()
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := s.ctx()
			defer cancel()
			sb, err := s.c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Snapshot: snapshot})
			if err == nil {
				mu.Lock()
				ids = append(ids, sb.ID)
				mu.Unlock()
				var res *client.ExecResult
				res, err = s.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/true"}})
				if err == nil && res.ExitCode != 0 {
					err = fmt.Errorf("exec in fork %s: exit %d: %s", sb.ID, res.ExitCode, oneLine(res.Stderr))
				}
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	ms := float64(time.Since(start)) / float64(time.Millisecond)
	if first != nil {
		return 0, 0, first
	}
	var total int64
	for _, id := range ids {
		if root, cg := s.runscPid(id); root != 0 {
			total += measureSandbox(&Idle{Root: root, Cgroup: cg}, self).pss
		}
	}
	return ms, float64(total) / float64(n), nil
}
