package bench

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"
)

// UnitCreatesPerSecond is the unit of the concurrent-create throughput
// figures.
const UnitCreatesPerSecond = "creates/s"

// ConcurrencyLevels are the numbers of clients of the concurrent-create
// figures.
var ConcurrencyLevels = []int{1, 10, 50}

// burstStats is what one peer's bursts at one level measured.
type burstStats struct {
	latencies []float64 // ms, every successful create+exec
	rates     []float64 // creates/s per round, NaN for a failed round
}

// ConcurrentCreateFigures measures, for each level c, c clients that at
// the same moment each create a live sandbox and run argv in it (create to
// the first exec's end; stopping is not timed), against every peer that
// can do the same (airlock's API on each tier given, crun/runc/runsc run
// --detach then exec). Two figures per level: the p99 latency of a burst
// (its samples are one burst's p99 each; Detail has p50/p95/p99 over every
// create of every round) and creates per second (c over the burst's wall
// time; Detail has it per core, to compare machines).
func ConcurrentCreateFigures(peers []Peer, argv []string, levels []int, runs int) []Figure {
	var out []Figure
	cores := float64(runtime.NumCPU())
	for _, c := range levels {
		ps := make([]Peer, len(peers))
		for i, p := range peers {
			w := p
			switch {
			case p.Missing != "":
			case !p.CanExec || p.StartIdle == nil:
				w.Missing = noExec
			default:
				w.Note = p.IdleNote + "; then " + p.ExecNote
			}
			ps[i] = w
		}
		stats := map[string]*burstStats{}
		var mu sync.Mutex
		lat := Sample(ps, UnitMS, runs, func(p Peer) (float64, error) {
			ls, wall, err := burst(p, argv, c)
			mu.Lock()
			defer mu.Unlock()
			st := stats[p.Name]
			if st == nil {
				st = &burstStats{}
				stats[p.Name] = st
			}
			if err != nil {
				return 0, err
			}
			st.latencies = append(st.latencies, ls...)
			st.rates = append(st.rates, float64(c)/wall.Seconds())
			return Percentile(ls, 99), nil
		})
		lat.Name = fmt.Sprintf("concurrent creates x%d: p99", c)
		lat.Command = append([]string(nil), argv...)
		lat.Note = fmt.Sprintf("%d clients at once each create a live sandbox and run the command in it until it exits; a sample is one burst's p99 (the first burst, a warm-up, is not counted); stopping is not timed", c)
		rate := Figure{Name: fmt.Sprintf("concurrent creates x%d: throughput", c), Unit: UnitCreatesPerSecond, Rounds: runs,
			Command: lat.Command, Note: fmt.Sprintf("%d creates over the burst's wall time (more is better; the ratio is airlock's over the peer's, so above 1 is better here)", c)}
		for i := range lat.Results {
			r := &lat.Results[i]
			rr := PeerResult{Peer: r.Peer, Note: r.Note, Missing: r.Missing, Error: r.Error, Failures: r.Failures}
			if st := stats[r.Peer]; st != nil && len(r.Samples) > 0 {
				// The first burst was the warm-up.
				counted := st.latencies[min(c, len(st.latencies)):]
				r.Detail = fmt.Sprintf("over %d creates: p50 %.1f ms, p95 %.1f ms, p99 %.1f ms", len(counted),
					Percentile(counted, 50), Percentile(counted, 95), Percentile(counted, 99))
				rr.rounds = roundsOf(r, st.rates[min(1, len(st.rates)):])
				if ok := finite(rr.rounds); len(ok) > 0 {
					m := Median(ok)
					rr.Detail = fmt.Sprintf("median %.1f creates/s, %.1f per core (%d cores)", m, m/cores, int(cores))
				}
			}
			rate.Results = append(rate.Results, rr)
		}
		rate.summarise()
		out = append(out, lat, rate)
	}
	return out
}

// BurstTimeout is how long one create of a burst of c may take through
// airlock's API, for a per-operation timeout of op: op once for every ten
// creates queued with it (gVisor's starts are gated, a few at a time, and
// each may take its agent's whole hello bound on a loaded host).
func BurstTimeout(op time.Duration, c int) time.Duration {
	return op * time.Duration(1+c/10)
}

// roundsOf lays rates (one per successful round, in order) out on the
// rounds of r, NaN where r's round failed, so that ratios pair rounds.
func roundsOf(r *PeerResult, rates []float64) []float64 {
	out := make([]float64, len(r.rounds))
	k := 0
	for i, v := range r.rounds {
		if math.IsNaN(v) || k >= len(rates) {
			out[i] = math.NaN()
			continue
		}
		out[i] = rates[k]
		k++
	}
	return out
}

// burst runs c create+exec at once for p and returns each one's latency
// in ms and the burst's wall time. Every sandbox is stopped afterwards
// (not timed); any failure fails the burst.
func burst(p Peer, argv []string, c int) ([]float64, time.Duration, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		lats  []float64
		idles []*Idle
		first error
	)
	gate := make(chan struct{})
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			start := time.Now()
			idle, err := p.StartIdle(liveIdle)
			if err == nil {
				err = idle.Exec(argv)
			}
			d := time.Since(start)
			if err == nil {
				// What the start left for later (airlock's peers find the
				// sandbox's host processes) is not part of its latency.
				err = idle.settle()
			}
			mu.Lock()
			defer mu.Unlock()
			if idle != nil {
				idles = append(idles, idle)
			}
			if err != nil {
				if first == nil {
					first = err
				}
				return
			}
			lats = append(lats, float64(d)/float64(time.Millisecond))
		}()
	}
	begin := time.Now()
	close(gate)
	wg.Wait()
	wall := time.Since(begin)
	var sw sync.WaitGroup
	for _, idle := range idles {
		sw.Add(1)
		go func() {
			defer sw.Done()
			if err := idle.Stop(); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("stop: %w", err)
				}
				mu.Unlock()
			}
		}()
	}
	sw.Wait()
	if first != nil {
		return nil, 0, first
	}
	return lats, wall, nil
}

// Percentile returns the q-th percentile (0-100) of xs by the
// nearest-rank method, or NaN for none.
func Percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	k := int(math.Ceil(q/100*float64(len(s)))) - 1
	return s[max(0, min(k, len(s)-1))]
}
