package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/internal/testserver"
)

// agentProcs counts the processes whose executable is the file at path
// (its device and inode: a sandbox's agent runs it through a bind mount).
func agentProcs(t *testing.T, path string) int {
	t.Helper()
	var want syscall.Stat_t
	if err := syscall.Stat(path, &want); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+e.Name()+"/exe", &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
			n++
		}
	}
	return n
}

// startServe runs bin serve --no-auth with args until it listens; it
// returns its URL and a function that stops it and returns its log.
func startServe(t *testing.T, bin string, args ...string) (string, func() string) {
	t.Helper()
	srv := testserver.StartBinary(t, bin, testserver.StateDir(t), append([]string{"--no-auth"}, args...)...)
	return srv.URL, func() string {
		srv.Stop()
		return srv.ReadLog()
	}
}

// refusedServe runs bin serve with args, which should refuse to start;
// a server that starts anyway is killed after 30 s (the caller's check of
// the exit then fails).
func refusedServe(t *testing.T, bin string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, bin, append([]string{"serve", "--no-auth", "--listen", "127.0.0.1:0", "--state-dir", testserver.StateDir(t)}, args...)...).CombinedOutput()
}

// infoAgent reads agent_binary from url's /v1/info.
func infoAgent(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		AgentBinary string `json:"agent_binary"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	return info.AgentBinary
}

// execTrue creates a sandbox on url and runs /bin/true in it.
func execTrue(t *testing.T, url string) string {
	t.Helper()
	code, sb := testserver.PostJSON(t, url+"/v1/sandboxes", "", `{}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, sb)
	}
	id, _ := sb["id"].(string)
	code, res := testserver.PostJSON(t, url+"/v1/sandboxes/"+id+"/exec", "", `{"argv":["/bin/true"]}`)
	if code != 200 || res["status"] != "ok" {
		t.Fatalf("exec: %d %v", code, res)
	}
	return id
}

// TestLeanAgent: serve runs its sandboxes' agents from airlock-agent next
// to it when its build stamp matches (from the airlock binary with
// --agent-binary none), and never from an agent-only binary it cannot
// trust: another source's build (explicit: refuses to start; found next to
// it: falls back to itself, saying so), or one others may write.
func TestLeanAgent(t *testing.T) {
	testserver.NeedRoot(t)
	bin := airlockBin(t)
	lean := filepath.Join(filepath.Dir(bin), leanAgentName)

	t.Run("found next to airlock", func(t *testing.T) {
		before := agentProcs(t, lean)
		url, stop := startServe(t, bin)
		execTrue(t, url)
		execTrue(t, url)
		if got := infoAgent(t, url); got != lean {
			t.Errorf("/v1/info agent_binary %q, want %q", got, lean)
		}
		if n := agentProcs(t, lean) - before; n < 2 {
			t.Errorf("%d processes run %s after two creates, want the two agents", n, lean)
		}
		if log := stop(); !strings.Contains(log, "agent: "+lean) {
			t.Errorf("serve did not say which agent it uses:\n%s", log)
		}
	})

	t.Run("none", func(t *testing.T) {
		before, selfBefore := agentProcs(t, lean), agentProcs(t, bin)
		url, _ := startServe(t, bin, "--agent-binary", "none")
		execTrue(t, url)
		if got := infoAgent(t, url); got != bin {
			t.Errorf("--agent-binary none: /v1/info agent_binary %q, want %q", got, bin)
		}
		if n := agentProcs(t, lean) - before; n != 0 {
			t.Errorf("--agent-binary none: %d sandboxes run %s", n, lean)
		}
		if n := agentProcs(t, bin) - selfBefore; n < 2 { // the server and the agent
			t.Errorf("--agent-binary none: %d new processes run airlock, want the server and its agent", n)
		}
	})

	// An agent built from other source (another stamp).
	other := filepath.Join(t.TempDir(), "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-ldflags", "-X github.com/airlock-dev/airlock/agent.stampOverride=some-other-build", "-o", filepath.Join(other, leanAgentName), "github.com/airlock-dev/airlock/cmd/airlock-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	copyFile := func(src, dst string, mode os.FileMode) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dst, mode); err != nil {
			t.Fatal(err)
		}
	}
	otherAgent := filepath.Join(other, leanAgentName)

	t.Run("other source, explicit", func(t *testing.T) {
		out, err := refusedServe(t, bin, "--agent-binary", otherAgent)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitSetup || !strings.Contains(string(out), "built from other source") {
			t.Fatalf("serve with a mismatched --agent-binary: %v %s", err, out)
		}
	})

	t.Run("other source, found next to airlock", func(t *testing.T) {
		self := filepath.Join(other, "airlock")
		copyFile(bin, self, 0o755)
		before := agentProcs(t, otherAgent)
		url, stop := startServe(t, self)
		execTrue(t, url)
		if n := agentProcs(t, otherAgent) - before; n != 0 {
			t.Errorf("%d sandboxes run the mismatched agent", n)
		}
		if n := agentProcs(t, self); n < 2 {
			t.Errorf("%d processes run airlock, want the server and its sandbox's agent", n)
		}
		if log := stop(); !strings.Contains(log, "agent: not using "+otherAgent) || !strings.Contains(log, "built from other source") {
			t.Errorf("serve did not say why it does not use %s:\n%s", otherAgent, log)
		}
	})

	t.Run("in a directory writable by others", func(t *testing.T) {
		d := filepath.Join(t.TempDir(), "shared")
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		w := filepath.Join(d, leanAgentName)
		copyFile(lean, w, 0o755)
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
		out, err := refusedServe(t, bin, "--agent-binary", w)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitSetup || !strings.Contains(string(out), "is writable by group or others") {
			t.Fatalf("serve with --agent-binary in a world-writable directory: %v %s", err, out)
		}
	})

	t.Run("in a directory another user owns", func(t *testing.T) {
		d := filepath.Join(t.TempDir(), "theirs")
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		w := filepath.Join(d, leanAgentName)
		copyFile(lean, w, 0o755)
		if err := os.Chown(d, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		out, err := refusedServe(t, bin, "--agent-binary", w)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitSetup || !strings.Contains(string(out), "is owned by another user") {
			t.Fatalf("serve with --agent-binary in another user's directory: %v %s", err, out)
		}
	})

	t.Run("writable by others", func(t *testing.T) {
		w := filepath.Join(t.TempDir(), leanAgentName)
		copyFile(lean, w, 0o775)
		out, err := refusedServe(t, bin, "--agent-binary", w)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitSetup || !strings.Contains(string(out), "writable by group or others") {
			t.Fatalf("serve with a group-writable --agent-binary: %v %s", err, out)
		}
	})
}
