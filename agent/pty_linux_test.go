package agent_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/agent"
)

// TestPtyLastOutput: what a short-lived process writes to its terminal just
// before it exits always reaches the client, also when the machine is busy.
// The kernel hands a terminal's output to the master from a kworker (nice
// 0), which under load can run long after the writer exited; the agent
// used to report the exit once the master had been quiet for a grace
// period, and lost that output. Here the agent runs at a higher priority
// than the kworker, which shares the CPUs with hogs above its own, so the
// kworker lags as at CI's load. Every run must return its output: half of
// them alone on their terminal (the master reads EOF), half with a detached
// descendant holding the terminal open (the exit comes on the grace period).
func TestPtyLastOutput(t *testing.T) {
	ta := startAgent(t)
	path, err := exec.LookPath("stress-ng")
	if err != nil {
		t.Skip("stress-ng not installed (scripts/setup.sh installs it)")
	}
	if err := renice(ta.cmd.Process.Pid, -20); errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		t.Skipf("raising the agent's priority needs CAP_SYS_NICE: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	hog := exec.Command("nice", "-n", "-10", path, "--cpu", "4", "--timeout", "120s", "--quiet")
	hog.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-hog.Process.Pid, syscall.SIGKILL); hog.Wait() })
	shells := []string{"sleep 0.02; printf x", "setsid sleep 1 & sleep 0.02; printf x"}
	const runs, parallel = 400, 8
	var mu sync.Mutex
	lost := 0
	var wg sync.WaitGroup
	for w := range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < runs; i += parallel {
				p, err := ta.c.Exec(ctxT(t), agent.ExecRequest{Shell: shells[i%2], Pty: &agent.PtySize{Cols: 80, Rows: 24}})
				if err != nil {
					t.Errorf("run %d: exec: %v", i, err)
					return
				}
				out, _, _, st, err := p.Collect(ctxT(t), 1<<20)
				p.Close()
				if err != nil || st.Code != 0 || st.Signal != "" {
					t.Errorf("run %d: %q, %+v, %v", i, out, st, err)
					return
				}
				if string(out) != "x" {
					mu.Lock()
					lost++
					mu.Unlock()
					t.Errorf("run %d (%s): output %q, want \"x\"", i, shells[i%2], out)
				}
			}
		}()
	}
	wg.Wait()
	if lost > 0 {
		t.Errorf("%d of %d terminal commands lost their output", lost, runs)
	}
}

// TestPtyBigOutputComplete: a terminal command's stdio is blocking, so a
// program writing faster than the terminal drains waits instead of failing
// with EAGAIN (tr used to exit 1 after ~10 KiB of a MiB), and all of its
// output arrives, much of it still in the terminal's buffers at its exit.
func TestPtyBigOutputComplete(t *testing.T) {
	ta := startAgent(t)
	const size = 1 << 20
	for i := range 5 {
		p, err := ta.c.Exec(ctxT(t), agent.ExecRequest{Shell: "head -c 1048576 /dev/zero | tr '\\0' x", Pty: &agent.PtySize{Cols: 80, Rows: 24}})
		if err != nil {
			t.Fatal(err)
		}
		out, _, _, st, err := p.Collect(ctxT(t), 2*size)
		p.Close()
		if err != nil || st.Code != 0 || len(out) != size {
			t.Errorf("run %d: %d bytes of %d, %+v, %v: %q", i, len(out), size, st, err, out[max(0, len(out)-200):])
		}
	}
}

// renice sets the nice value of every thread of process pid.
func renice(pid, nice int) error {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return err
	}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil && err != syscall.ESRCH {
			return fmt.Errorf("renice thread %d of %d: %w", tid, pid, err)
		}
	}
	return nil
}
