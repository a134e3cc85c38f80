package manager

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// AgentLogMax caps a sandbox's agent.log: what the agent writes beyond it
// is read and dropped, with one line saying so.
const AgentLogMax = 1 << 20

// agentLog returns the write end of a pipe that becomes the agent's stdout
// and stderr, and drains the read end into path, at most AgentLogMax bytes.
// The sandbox never holds a host file: nothing it does can grow agent.log
// past the cap or write anywhere else. The caller closes the write end once
// the sandbox has its copy; draining ends when the last holder exits. (A
// reattached sandbox's agent writes to a pipe nobody reads: its log is lost
// with the server that started it, and its writes fail with EPIPE.)
func agentLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("manager: agent log: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("manager: agent log pipe: %w", err)
	}
	go func() {
		defer f.Close()
		defer r.Close()
		n, _ := io.Copy(f, io.LimitReader(r, AgentLogMax))
		if n < AgentLogMax {
			return
		}
		if dropped, _ := io.Copy(io.Discard, r); dropped > 0 {
			fmt.Fprintf(f, "\nairlock: agent log capped at %d bytes; %d more bytes dropped\n", AgentLogMax, dropped)
		}
	}()
	return w, nil
}

// agentLogTailMax is how much of the end of agent.log a log line quotes.
const agentLogTailMax = 1 << 10

// agentLogTail returns "; agent log: ..." with the last lines of the agent
// log at path (what the agent, and under gvisor runsc, said before it
// ended), or "" if it is empty or unreadable.
func agentLogTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var b []byte
	if fi, err := f.Stat(); err == nil && fi.Size() > agentLogTailMax {
		b = make([]byte, agentLogTailMax)
		n, _ := f.ReadAt(b, fi.Size()-agentLogTailMax)
		b = b[:n]
	} else {
		b, _ = io.ReadAll(io.LimitReader(f, agentLogTailMax))
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return ""
	}
	return "; agent log: " + strings.ReplaceAll(t, "\n", " | ")
}
