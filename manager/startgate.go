package manager

import (
	"context"
	"runtime"
	"sync"
)

// startGate bounds how many sandboxes of one tier may be between their
// start and their agent's hello at once, for tiers that boot a kernel of
// their own (gVisor's sentry, a microVM's guest). Fifty such starts at once
// on a two-core host each get so little CPU that none of their agents
// answers its hello within the handshake's bound and every create fails
// (`airlock bench --only concurrent`, 2026-11-28: "agent hello: i/o
// timeout" for 50 gVisor creates); queued, they all succeed, each in the
// time of a few starts. Native starts are cheap and are not gated.
//
// Most of that starvation was the sandboxes already up: each idle gVisor
// agent's memory watcher cost 5% of a CPU until 2026-11-28 (now about 1%).
// Since then 8 starts per CPU at once finish a burst of 50 sooner than 2
// per CPU did, with no failed hello even at load 100 (docs/benchmarks.md,
// "Concurrent creates"); the hello of a booting tier also waits longer
// (bootHelloTimeout).
type startGate struct {
	mu    sync.Mutex
	slots map[string]chan struct{}
	size  int
}

// newStartGate makes a gate of size slots per tier (at least 1); zero
// means 8 per CPU, at least 4.
func newStartGate(size int) *startGate {
	if size <= 0 {
		size = max(4, 8*runtime.NumCPU())
	}
	return &startGate{slots: map[string]chan struct{}{}, size: size}
}

// enter waits for a slot of tier name, or for ctx to end, and returns the
// function that gives the slot back (call it exactly once).
func (g *startGate) enter(ctx context.Context, name string) (func(), error) {
	if g == nil {
		return func() {}, nil
	}
	g.mu.Lock()
	ch, ok := g.slots[name]
	if !ok {
		ch = make(chan struct{}, g.size)
		g.slots[name] = ch
	}
	g.mu.Unlock()
	select {
	case ch <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-ch }) }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
