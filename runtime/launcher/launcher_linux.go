// Package launcher forks processes that carry a parent-death signal from
// one OS thread that never exits.
//
// The parent-death signal (Pdeathsig) of a process fires when the thread
// that forked it exits, not when the process does. Go ends an OS thread
// when a goroutine locked to it returns, and airlock has such goroutines:
// egressNetns unshares a network namespace on a locked thread and lets it
// end with the goroutine. A runsc forked from a thread that some later
// sandbox's egressNetns then took was killed with it: the first of two
// gvisor sandboxes with network created back to back ended about 0.3 s
// after the second one's create ("the sandbox's agent exited", runsc
// killed by signal 9; issue 29). Every runsc or QEMU that carries a
// Pdeathsig is therefore forked from one thread that never exits.
package launcher

import (
	"runtime"
	"sync"
)

var launcher struct {
	once sync.Once
	work chan func()
}

// Run runs f (a fork) on the launcher thread and returns its error.
func Run(f func() error) error {
	launcher.once.Do(func() {
		launcher.work = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for w := range launcher.work {
				w()
			}
		}()
	})
	done := make(chan error, 1)
	launcher.work <- func() { done <- f() }
	return <-done
}
