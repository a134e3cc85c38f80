package manager

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAgentLogCapped: whatever the agent writes, agent.log stays within
// AgentLogMax plus one line saying how much was dropped, and the writer is
// never blocked (the rest is drained).
func TestAgentLogCapped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.log")
	w, err := agentLog(path)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("forged audit line\n"), 4096)
	total := 0
	for total < 3*AgentLogMax {
		n, err := w.Write(chunk)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	w.Close()
	var b []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ = os.ReadFile(path)
		if bytes.Contains(b, []byte("bytes dropped")) || time.Now().After(deadline) {
			break
		}
	}
	note := b[min(len(b), AgentLogMax):]
	if len(b) > AgentLogMax+200 || !strings.Contains(string(note), "agent log capped") {
		t.Fatalf("agent.log is %d bytes after %d written (cap %d), tail %q", len(b), total, AgentLogMax, note)
	}
}
