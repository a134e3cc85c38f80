package mcp_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/store"
)

// syncBuf is a goroutine-safe buffer for a child's stderr.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// stdioServer starts `airlock mcp` and connects to it over its stdio.
func stdioServer(t *testing.T, args ...string) (*sdk.ClientSession, *exec.Cmd, *syncBuf) {
	t.Helper()
	cmd := exec.Command(airlockBin(t), append([]string{"mcp"}, args...)...)
	logs := &syncBuf{}
	cmd.Stderr = logs
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
		&sdk.CommandTransport{Command: cmd, TerminateDuration: 20 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connect to airlock mcp: %v\n%s", err, logs)
	}
	t.Cleanup(func() {
		cs.Close()
		if t.Failed() {
			t.Logf("airlock mcp stderr:\n%s", logs)
		}
	})
	return cs, cmd, logs
}

// TestStdioBinary drives a real `airlock mcp` over stdio: tools, a hostile
// call, and the session's sandbox gone once stdin closes; once per runtime
// (--default-runtime), gvisor skipped only where runsc is not installed.
func TestStdioBinary(t *testing.T) {
	needRoot(t)
	for _, rt := range []string{"native", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "gvisor" {
				if _, err := gvisor.Available(); err != nil {
					t.Skipf("gvisor tier unavailable: %v", err)
				}
			}
			stdioBinary(t, rt)
		})
	}
}

func stdioBinary(t *testing.T, runtime string) {
	base := shortDir(t)
	cs, cmd, logs := stdioServer(t, "--state-dir", base, "--pids", "64", "--max-output", "4K", "--default-runtime", runtime)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	for _, want := range []string{"run_code", "run_command", "write_file", "read_file", "list_files", "create_sandbox", "list_sandboxes", "kill_sandbox"} {
		if !slices.Contains(names, want) {
			t.Fatalf("tools %v lack %s", names, want)
		}
	}
	mustOK(t, cs, "write_file", map[string]any{"path": "a.sh", "content": "echo from script\n"})
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "sh a.sh"}); out != "from script\n\n" {
		t.Fatalf("got %q", out)
	}
	mustFail(t, cs, "run_command", map[string]any{"command": "bash -c ':(){ :|:& };:'"})
	mustFail(t, cs, "run_command", map[string]any{"command": "cat /etc/shadow"})
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "echo healthy"}); out != "healthy\n\n" {
		t.Fatalf("after hostile calls: %q", out)
	}
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "seq 1 10000"}); !strings.Contains(out, "of stdout cut here") {
		t.Fatalf("--max-output not applied: %d bytes", len(out))
	}
	mustOK(t, cs, "run_code", py("x = 41"))
	r := call(t, cs, "run_code", py("import matplotlib.pyplot as plt\nplt.plot([x, 1])\nx + 1"))
	if r.IsError || len(images(r)) != 1 || !strings.Contains(text(r), "42") {
		t.Fatalf("run_code: %s %+v", text(r), r.Content)
	}
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "uname -r"}); strings.Contains(out, "gvisor") != (runtime == "gvisor") {
		t.Fatalf("runtime %s: uname -r says %q", runtime, out)
	}
	own := ownSandbox(t, cs)

	// Closing stdin ends the session: the server kills the sandbox and
	// exits by itself.
	start := time.Now()
	if err := cs.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Exited() || cmd.ProcessState.ExitCode() != 0 || time.Since(start) > 15*time.Second {
		t.Fatalf("airlock mcp did not exit cleanly on EOF: %v after %s\n%s", cmd.ProcessState, time.Since(start), logs)
	}
	st, err := store.Open(filepath.Join(base, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if rec := waitGone(t, st, own); rec.State != store.StateKilled {
		t.Fatalf("sandbox ended as %s (%s)", rec.State, rec.EndReason)
	}
}

// TestStdioConcurrentServers: two `airlock mcp` on one state dir take
// separate slots and leave each other's sandboxes alone.
func TestStdioConcurrentServers(t *testing.T) {
	needRoot(t)
	base := shortDir(t)
	a, _, alogs := stdioServer(t, "--state-dir", base)
	mustOK(t, a, "write_file", map[string]any{"path": "mine", "content": "a"})
	b, _, blogs := stdioServer(t, "--state-dir", base)
	mustOK(t, b, "write_file", map[string]any{"path": "mine", "content": "b"})
	if out := mustOK(t, a, "read_file", map[string]any{"path": "mine"}); out != "a\n" {
		t.Fatalf("a's file: %q", out)
	}
	if out := mustOK(t, b, "read_file", map[string]any{"path": "mine"}); out != "b\n" {
		t.Fatalf("b's file: %q", out)
	}
	if !strings.Contains(alogs.String(), filepath.Join(base, "0")) || !strings.Contains(blogs.String(), filepath.Join(base, "1")) {
		t.Fatalf("slots: %q / %q", alogs, blogs)
	}
}

// TestStdioFlags: bad configuration is refused before serving.
func TestStdioFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--profile", "root"},
		{"--memory", "1K"},
		{"--memory", "lots"},
		{"--bogus"},
		{"extra-arg"},
		{"--net", "allow:"},
		{"--net", "allow:*"},
		{"--net", "none", "--net", "open"},
		{"--secret", "api.test:X-Key:v"},
	} {
		cmd := exec.Command(airlockBin(t), append([]string{"mcp", "--state-dir", t.TempDir()}, args...)...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 125 {
			t.Errorf("%v: %v %s", args, err, out)
		}
	}
	cmd := exec.Command(airlockBin(t), "mcp", "--state-dir", t.TempDir())
	cmd.Env = append(cmd.Environ(), "AIRLOCK_PROFILE=nope")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "nope") {
		t.Errorf("AIRLOCK_PROFILE=nope: %v %s", err, out)
	}
}
