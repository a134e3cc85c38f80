// Package bench is the peer-comparison harness behind `airlock bench`.
//
// The machines airlock runs on are shared and noisy, so a figure is never an
// absolute time from one run: every peer (the bare command, unshare(1),
// bubblewrap, crun, runc, gVisor runsc, sandbox-runtime srt, and airlock
// itself) is measured in the same run, alternating A B A B ..., and each peer
// is reported with its median, min and max and with the median of the
// per-round ratios airlock/peer.
//
// A Peer is generic: it is one way of running a command. DetectPeers builds
// the peers found on this machine (and lists the missing ones with a reason);
// the caller adds the "airlock" peer, which Alternate uses as the reference
// for ratios.
package bench

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Reference is the peer name that ratios are computed against.
const Reference = "airlock"

// UnitMS is the unit of timing figures: milliseconds.
const UnitMS = "ms"

// Peer is one way of running a command: bare, unshare, bwrap, crun, runc,
// runsc, srt, or airlock.
type Peer struct {
	// Name identifies the peer in tables and JSON; "airlock" is the
	// reference for ratios.
	Name string
	// Missing is the reason the peer cannot run on this machine; a missing
	// peer is reported, never run.
	Missing string
	// Note says how the peer is invoked (for the report).
	Note string
	// Prepare, if set, is called once at the start of every figure before
	// the warm-up run. An error makes the peer fail for that figure.
	Prepare func() error
	// Run runs argv once to completion and reports whether it succeeded.
	Run func(argv []string) error
	// Cleanup, if set, is called once at the end of every figure in which
	// Prepare was called. Prepare and Cleanup must be safe to call again
	// for the next figure.
	Cleanup func()
	// StartIdle, if set, starts argv (an idle command such as sleep) as a
	// sandbox that stays up, for the density figure, and returns once it
	// runs. Nil means the peer cannot be measured for density; IdleMissing
	// then says why.
	StartIdle func(argv []string) (*Idle, error)
	// IdleMissing is why StartIdle is nil, for the report.
	IdleMissing string
	// IdleNote says how StartIdle starts a sandbox, where that differs
	// from Note.
	IdleNote string
	// CanExec says that the sandboxes StartIdle returns can run further
	// commands (Idle.Exec): the exec, live start, throughput figures.
	CanExec bool
	// ExecNote says how Idle.Exec runs a command, for the report.
	ExecNote string
}

// Figure is one measured quantity (cold start, cold python, ...) for every
// peer.
type Figure struct {
	// Name is the figure's name, e.g. "cold start".
	Name string `json:"name"`
	// Unit is the unit of the samples, e.g. "ms" or "execs/s".
	Unit string `json:"unit"`
	// Command is the command that was run, if the figure runs one.
	Command []string `json:"command,omitempty"`
	// Unavailable is why the figure could not be measured at all in this
	// build or on this machine (e.g. the server it needs does not exist
	// yet). An unavailable figure has no results; it is reported, never
	// silently dropped.
	Unavailable string `json:"unavailable,omitempty"`
	// Note says how the figure was measured, where that is not obvious
	// from its name (e.g. how density is counted).
	Note string `json:"note,omitempty"`
	// Rounds is the number of measured rounds (excluding warm-up).
	Rounds int `json:"rounds"`
	// Results holds one entry per peer, in the order the peers were given.
	Results []PeerResult `json:"results"`
}

// PeerResult is one peer's samples and statistics within a Figure.
type PeerResult struct {
	// Peer is the peer's name.
	Peer string `json:"peer"`
	// Note says how the peer was invoked.
	Note string `json:"note,omitempty"`
	// Missing is the reason the peer was not measured because it is not
	// available on this machine.
	Missing string `json:"missing,omitempty"`
	// Error is the first error seen while running the peer (prepare,
	// warm-up or a measured run).
	Error string `json:"error,omitempty"`
	// Failures counts the measured runs that failed.
	Failures int `json:"failures,omitempty"`
	// Samples are the successful measured values in the figure's unit, in
	// round order.
	Samples []float64 `json:"samples,omitempty"`
	// Median, Min and Max summarise Samples; they are 0 when there are no
	// samples.
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	// Ratio is the median over rounds of airlock's sample divided by this
	// peer's sample in the same round; 0 when there is no airlock peer or
	// no round where both succeeded. Below 1 means airlock took less.
	Ratio float64 `json:"ratio_airlock_over_peer,omitempty"`
	// RatioPairs is the number of rounds the Ratio is computed from.
	RatioPairs int `json:"ratio_pairs,omitempty"`
	// Detail is extra information about a successful measurement (for
	// density: how many sandboxes ran and what the cost is made of).
	Detail string `json:"detail,omitempty"`
	// Density holds the density measurement's particulars, for the
	// density figure only.
	Density *DensityResult `json:"density,omitempty"`

	// rounds holds one value per round, NaN for a failed run.
	rounds []float64
}

// Measure takes one sample of a peer in a figure's unit.
type Measure func(p Peer) (float64, error)

// Alternate measures the wall-clock time of p.Run(argv) for every peer, in
// milliseconds. See Sample for the procedure.
func Alternate(peers []Peer, argv []string, runs int) Figure {
	fig := Sample(peers, UnitMS, runs, func(p Peer) (float64, error) {
		if p.Run == nil {
			return 0, errors.New("peer has no Run function")
		}
		start := time.Now()
		err := p.Run(argv)
		d := time.Since(start)
		return float64(d) / float64(time.Millisecond), err
	})
	fig.Command = append([]string(nil), argv...)
	return fig
}

// Sample runs measure for every available peer: first Prepare, then one
// warm-up sample per peer (discarded), then runs rounds in which every peer
// is measured once, the order rotated by one each round so no peer is always
// first or last; finally Cleanup. A peer whose Prepare or warm-up fails is not
// measured further and is reported with the error. The returned Figure has no
// Name; the caller sets it.
func Sample(peers []Peer, unit string, runs int, measure Measure) Figure {
	fig := Figure{Unit: unit, Rounds: runs, Results: make([]PeerResult, len(peers))}
	var active []int
	for i, p := range peers {
		r := &fig.Results[i]
		r.Peer, r.Note, r.Missing = p.Name, p.Note, p.Missing
		if p.Missing != "" {
			continue
		}
		r.rounds = make([]float64, runs)
		for k := range r.rounds {
			r.rounds[k] = math.NaN()
		}
		active = append(active, i)
	}

	// Prepare and warm up, in the given order.
	var running []int
	for _, i := range active {
		p, r := peers[i], &fig.Results[i]
		if p.Prepare != nil {
			if err := p.Prepare(); err != nil {
				r.Error = "prepare: " + err.Error()
				if p.Cleanup != nil {
					p.Cleanup()
				}
				continue
			}
		}
		if _, err := measure(p); err != nil {
			r.Error = "warm-up: " + err.Error()
			if p.Cleanup != nil {
				p.Cleanup()
			}
			continue
		}
		running = append(running, i)
	}

	for round := 0; round < runs; round++ {
		n := len(running)
		for k := 0; k < n; k++ {
			i := running[(k+round)%n]
			r := &fig.Results[i]
			v, err := measure(peers[i])
			if err != nil {
				r.Failures++
				if r.Error == "" {
					r.Error = fmt.Sprintf("round %d: %v", round+1, err)
				}
				continue
			}
			r.rounds[round] = v
		}
	}

	for _, i := range running {
		if peers[i].Cleanup != nil {
			peers[i].Cleanup()
		}
	}
	fig.summarise()
	return fig
}

// summarise fills the statistics of every result from its per-round values.
func (f *Figure) summarise() {
	var ref []float64
	for _, r := range f.Results {
		if r.Peer == Reference && r.rounds != nil {
			ref = r.rounds
		}
	}
	for i := range f.Results {
		r := &f.Results[i]
		r.Samples = finite(r.rounds)
		if len(r.Samples) == 0 {
			r.Samples = nil
			continue
		}
		r.Median = Median(r.Samples)
		r.Min, r.Max = MinMax(r.Samples)
		if ref != nil {
			pr := PairRatios(ref, r.rounds)
			if len(pr) > 0 {
				r.Ratio = Median(pr)
				r.RatioPairs = len(pr)
			}
		}
	}
}

// Unavailable returns a figure that could not be measured, with the reason.
func Unavailable(name, reason string) Figure {
	return Figure{Name: name, Unavailable: reason}
}

// Result returns the result for the named peer, or nil.
func (f *Figure) Result(peer string) *PeerResult {
	for i := range f.Results {
		if f.Results[i].Peer == peer {
			return &f.Results[i]
		}
	}
	return nil
}
