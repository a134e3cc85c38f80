package manager

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStartGateBounds: at most size holders of one tier at once, another
// tier's are counted apart, a waiter whose context ends gives up with its
// error, and a slot given back twice is given back once.
func TestStartGateBounds(t *testing.T) {
	g := newStartGate(3)
	var in, most atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, err := g.enter(context.Background(), "gvisor")
			if err != nil {
				t.Error(err)
				return
			}
			n := in.Add(1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			in.Add(-1)
			release()
			release()
		}()
	}
	wg.Wait()
	if m := most.Load(); m > 3 || m < 1 {
		t.Fatalf("%d holders at once, want 1 to 3", m)
	}
	var held []func()
	for range 3 {
		r, err := g.enter(context.Background(), "gvisor")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	if r, err := g.enter(context.Background(), "microvm"); err != nil {
		t.Fatalf("another tier waited for gvisor's slots: %v", err)
	} else {
		r()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := g.enter(ctx, "gvisor"); err == nil {
		t.Fatal("a fourth holder entered a gate of three")
	}
	for _, r := range held {
		r()
	}
	if r, err := g.enter(context.Background(), "gvisor"); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
}
