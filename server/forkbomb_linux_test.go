package server_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// TestAgentSurvivesForkBomb: a fork bomb fills the sandbox's pids limit
// while the agent works; the agent (PID 1, a Go program that may need OS
// threads) must survive, end the bomb when its exec times out, and answer
// the next exec. Repeated, since the failure depended on timing.
func TestAgentSurvivesForkBomb(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "bomb")
	s := startServer(t, state)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{Limits: &client.Limits{Pids: 48}, Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	// The agent keeps idle OS threads in reserve for when the bomb has taken
	// every slot (the Go runtime aborts if it cannot create one it needs).
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", initPid(t, state, sb.ID)))
	if err != nil {
		t.Fatal(err)
	}
	var threads int
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if threads < 10 {
		t.Fatalf("agent has %d threads, want at least 10 (a reserve of 8 idle threads)", threads)
	}
	for round := 0; round < 3; round++ {
		// Several bombs at once, plus file operations that need blocking
		// system calls (threads) in the agent while the slots are gone.
		errs := make(chan error, 4)
		for i := 0; i < 3; i++ {
			go func() {
				_, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "b() { b | b & }; b; sleep 5", Timeout: 2})
				errs <- err
			}()
		}
		go func() {
			for i := 0; i < 20; i++ {
				c.ListFiles(ctx, sb.ID, "/workspace", 1)
			}
			errs <- nil
		}()
		for i := 0; i < 4; i++ {
			<-errs // a bomb's exec may report an error or a timeout; the agent must live on
		}
		// The bombs' processes are being killed; once their slots are free
		// the same agent runs the next command.
		var last string
		ok := false
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"echo", "alive"}})
			if err == nil && strings.TrimSpace(res.Stdout) == "alive" {
				ok = true
				break
			}
			last = fmt.Sprintf("%+v %v", res, err)
			if err != nil && strings.Contains(err.Error(), "connection closed") {
				break // the agent died
			}
		}
		if !ok {
			t.Fatalf("round %d: agent did not survive the fork bomb: %s", round, last)
		}
	}
}
