package mcp_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/store"
)

// jsDir is the Node project with the official MCP TypeScript SDK,
// installed by scripts/setup.sh --tests.
const jsDir = "../tests/mcp-js"

// jsSummary is the last line mcp-scenario.mjs prints.
type jsSummary struct {
	OK      bool     `json:"ok"`
	Mode    string   `json:"mode"`
	Sandbox string   `json:"sandbox"`
	Tools   []string `json:"tools"`
	RunCode string   `json:"run_code"`
}

// runScenario runs mcp-scenario.mjs with args and returns its summary.
func runScenario(t *testing.T, env []string, args ...string) jsSummary {
	t.Helper()
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Skipf("%s/node_modules lacks @modelcontextprotocol/sdk (run scripts/setup.sh --tests): %v", jsDir, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node_modules is installed but node is not in PATH: %v", err)
	}
	cmd := exec.Command(node, append([]string{"mcp-scenario.mjs"}, args...)...)
	cmd.Dir = jsDir
	cmd.Env = append(append(os.Environ(), "REQUIRE_RUN_CODE=1"), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		err = <-done
	}
	t.Logf("mcp-scenario.mjs %s:\n%s", strings.Join(args[:1], " "), stderr.String())
	if err != nil {
		t.Fatalf("mcp-scenario.mjs: %v\nstdout: %s", err, stdout.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var sum jsSummary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil || !sum.OK || !strings.HasPrefix(sum.Sandbox, "sb-") {
		t.Fatalf("summary %q: %v", stdout.String(), err)
	}
	if sum.RunCode != "tested" {
		t.Fatalf("run_code was not tested: %+v", sum)
	}
	return sum
}

// TestTypeScriptClientStdio: the official TypeScript client launches
// `airlock mcp` and drives it; the session's sandbox is gone after it
// disconnects.
func TestTypeScriptClientStdio(t *testing.T) {
	needRoot(t)
	base := shortDir(t)
	sum := runScenario(t, nil, "stdio", airlockBin(t), "--state-dir", base, "--pids", "64")
	st, err := store.Open(filepath.Join(base, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if rec := waitGone(t, st, sum.Sandbox); rec.State != store.StateKilled {
		t.Fatalf("sandbox ended as %s (%s)", rec.State, rec.EndReason)
	}
}

// TestTypeScriptClientHTTP: the official TypeScript client drives /mcp of
// a real `airlock serve` with an API key; the session's sandbox is gone
// after it ends the session.
func TestTypeScriptClientHTTP(t *testing.T) {
	s := startServe(t)
	key := s.newKey(t, "mcp-js")
	sum := runScenario(t, []string{"AIRLOCK_KEY=" + key}, "http", s.URL+"/mcp")
	s.waitGone(t, key, sum.Sandbox)
}
