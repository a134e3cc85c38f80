package bench

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// UnitPerSecond is the unit of the throughput figure.
const UnitPerSecond = "execs/s"

// noExec is why a peer has no place in the figures that run commands in a
// live sandbox.
const noExec = "cannot run a command in an already running sandbox"

// liveIdle is the idle command of the live sandboxes the exec figures use.
var liveIdle = []string{"/bin/sleep", "3600"}

// livePeers returns, for every peer, a copy whose Prepare starts one live
// sandbox (and whose Cleanup stops it) and a lookup for that sandbox. The
// bare peer stays as it is: it is the floor, running the command directly.
// Peers that cannot exec into a running sandbox are marked missing.
func livePeers(peers []Peer) ([]Peer, func(name string) *Idle) {
	var mu sync.Mutex
	live := map[string]*Idle{}
	out := make([]Peer, len(peers))
	for i, p := range peers {
		w := p
		switch {
		case p.Missing != "" || p.Name == "bare":
		case !p.CanExec || p.StartIdle == nil:
			w.Missing = noExec
		default:
			w.Note = p.ExecNote
			w.Prepare = func() error {
				if p.Prepare != nil {
					if err := p.Prepare(); err != nil {
						return err
					}
				}
				idle, err := startSettled(p, liveIdle)
				if err != nil {
					return err
				}
				mu.Lock()
				live[p.Name] = idle
				mu.Unlock()
				return nil
			}
			w.Cleanup = func() {
				mu.Lock()
				idle := live[p.Name]
				delete(live, p.Name)
				mu.Unlock()
				if idle != nil {
					_ = idle.Stop()
				}
				if p.Cleanup != nil {
					p.Cleanup()
				}
			}
		}
		out[i] = w
	}
	get := func(name string) *Idle {
		mu.Lock()
		defer mu.Unlock()
		return live[name]
	}
	return out, get
}

// runIn returns the function that runs argv once for peer p in the exec
// figures: inside its live sandbox, or directly for the bare peer.
func runIn(p Peer, get func(string) *Idle) func(argv []string) error {
	if p.Name == "bare" {
		return p.Run
	}
	return func(argv []string) error {
		idle := get(p.Name)
		if idle == nil || idle.Exec == nil {
			return errors.New("no live sandbox")
		}
		return idle.Exec(argv)
	}
}

// ExecFigure times argv run in an already running sandbox of every peer
// that can do that (airlock through its API, crun/runc/runsc exec), with
// the bare command as the floor, alternating as Alternate does.
func ExecFigure(peers []Peer, argv []string, runs int) Figure {
	ps, get := livePeers(peers)
	fig := Sample(ps, UnitMS, runs, func(p Peer) (float64, error) {
		run := runIn(p, get)
		start := time.Now()
		err := run(argv)
		return float64(time.Since(start)) / float64(time.Millisecond), err
	})
	fig.Name, fig.Command = "exec", append([]string(nil), argv...)
	fig.Note = "one live sandbox per peer, started before the rounds; each sample runs the command once in it and waits for its exit"
	return fig
}

// LiveStartFigure times starting a live sandbox and running argv in it
// until argv has exited: airlock's POST /v1/sandboxes then exec through the
// API, or an OCI runtime's run --detach then exec. Stopping the sandbox is
// not timed. It is the figure a warm pool would shorten.
func LiveStartFigure(peers []Peer, argv []string, runs int) Figure {
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
	fig := Sample(ps, UnitMS, runs, func(p Peer) (float64, error) {
		start := time.Now()
		idle, err := p.StartIdle(liveIdle)
		if err != nil {
			return 0, err
		}
		err = idle.Exec(argv)
		d := time.Since(start)
		if err == nil {
			err = idle.settle() // finding its host processes is not timed
		}
		if serr := idle.Stop(); err == nil && serr != nil {
			err = fmt.Errorf("stop: %w", serr)
		}
		return float64(d) / float64(time.Millisecond), err
	})
	fig.Name, fig.Command = "live start (no pool)", append([]string(nil), argv...)
	fig.Note = "create a live sandbox and run the command in it until it exits (no warm pool); stopping the sandbox is not timed"
	return fig
}

// ThroughputFigure measures how many times per second clients concurrent
// clients, each running argv in a loop for window, complete it in one live
// sandbox per peer (the bare peer runs it directly).
func ThroughputFigure(peers []Peer, argv []string, runs, clients int, window time.Duration) Figure {
	ps, get := livePeers(peers)
	fig := Sample(ps, UnitPerSecond, runs, func(p Peer) (float64, error) {
		run := runIn(p, get)
		var (
			done, failed atomic.Int64
			firstErr     error
			once         sync.Once
			wg           sync.WaitGroup
		)
		start := time.Now()
		deadline := start.Add(window)
		for c := 0; c < clients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					if err := run(argv); err != nil {
						failed.Add(1)
						once.Do(func() { firstErr = err })
						continue
					}
					done.Add(1)
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start).Seconds()
		if failed.Load() > 0 {
			return float64(done.Load()) / elapsed, fmt.Errorf("%d of %d failed: %w", failed.Load(), failed.Load()+done.Load(), firstErr)
		}
		return float64(done.Load()) / elapsed, nil
	})
	fig.Name, fig.Command = "throughput", append([]string(nil), argv...)
	fig.Note = fmt.Sprintf("%d concurrent clients running the command in a loop for %s in one live sandbox per peer; completed runs per second (higher is better: airlock/peer above 1 means airlock did more)",
		clients, window)
	return fig
}
