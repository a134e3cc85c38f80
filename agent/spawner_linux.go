package agent

import (
	"runtime"
	"syscall"
)

// The spawner is one goroutine locked for good to one OS thread, from which
// the agent forks every workload process. Forked children start in the
// cgroups of the thread that forked them, so the host can leave this one
// thread in the workload's cgroup (pids and memory limits) and move every
// other thread of the agent into the sandbox's own group, the agent's
// reserve (native.Sandbox.ReserveAgent). The Go runtime never clones new
// threads from a locked one, so the agent's threads stay in its reserve.
type spawner struct {
	tid  int
	work chan func()
}

// theSpawner is started once, before the agent serves.
var theSpawner *spawner

func startSpawner() *spawner {
	s := &spawner{work: make(chan func())}
	ready := make(chan int)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is the spawner's
		ready <- syscall.Gettid()
		for f := range s.work {
			f()
		}
	}()
	s.tid = <-ready
	return s
}

// run runs f (a fork) on the spawner's thread and waits for it.
func (s *spawner) run(f func() error) error {
	if s == nil {
		return f()
	}
	done := make(chan error, 1)
	s.work <- func() { done <- f() }
	return <-done
}

// spawnerTid is the spawner thread's id, 0 if there is none.
func spawnerTid() int {
	if theSpawner == nil {
		return 0
	}
	return theSpawner.tid
}
