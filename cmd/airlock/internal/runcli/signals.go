package runcli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// InterruptContext is a context cancelled by SIGINT or SIGTERM; caught
// returns the signal that cancelled it, or nil.
func InterruptContext() (ctx context.Context, stop func(), caught func() os.Signal) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	var mu sync.Mutex
	var got os.Signal
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			mu.Lock()
			got = s
			mu.Unlock()
			cancel()
		case <-done:
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
			cancel()
		})
	}
	caught = func() os.Signal {
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	return ctx, stop, caught
}

// Interrupted reports on stderr that cmd was stopped by s (and what that
// did) and returns the shell's exit code for it: 128 + the signal's number
// (130 for SIGINT, 143 for SIGTERM), never the 137 of a SIGKILL or an OOM
// kill.
func Interrupted(cmd, what string, s os.Signal) int {
	n := 15
	name := "SIGTERM"
	if s == os.Interrupt {
		n, name = 2, "SIGINT"
	}
	fmt.Fprintf(os.Stderr, "%s: interrupted by %s: %s\n", cmd, name, what)
	return 128 + n
}
