package agent

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// killedMsg answers FrameKillProcesses.
type killedMsg struct {
	Killed int `json:"killed"`
}

// killRounds bounds how many sweeps killAllWorkload makes: a process forked
// while a sweep reads /proc is caught by the next one.
const killRounds = 100

// killAllWorkload SIGKILLs every live descendant of the agent, sweeping
// until none is left (or killRounds), and returns how many distinct
// processes it signalled.
func killAllWorkload() int {
	seen := map[int]bool{}
	for round := 0; round < killRounds; round++ {
		pids := descendants()
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
			seen[pid] = true
		}
		time.Sleep(time.Millisecond)
	}
	return len(seen)
}

// descendants lists the live (not zombie) descendants of the agent.
func descendants() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	children := map[int][]int{}
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + n + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], pid)
	}
	var out []int
	queue := []int{os.Getpid()}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

func (a *hostConn) handleKillProcesses(s *astream, payload []byte) (any, error) {
	if err := decodeJSON(payload, &emptyMsg{}); err != nil {
		return nil, invalid(err)
	}
	n := killAllWorkload()
	// Reaped before the answer, not only by the SIGCHLD reaper in its own
	// time: a listing right after it must not show a killed process as
	// running (seen in CI: E2B's connect with onResume "reboot" listed the
	// killed sleep).
	a.forkMu.Lock()
	a.reapAll()
	a.forkMu.Unlock()
	return killedMsg{Killed: n}, nil
}
