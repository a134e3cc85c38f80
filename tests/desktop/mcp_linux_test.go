package desktop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"airlock/client"
)

// node runs script (in this directory, with its node_modules) with args
// and env and returns the JSON object it prints last.
func node(t *testing.T, ctx context.Context, env []string, script string, args ...string) map[string]any {
	t.Helper()
	if _, err := os.Stat(filepath.Join("node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Skipf("tests/desktop/node_modules is not installed (scripts/setup.sh --tests runs npm ci there): %v", err)
	}
	bin, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node_modules is installed but node is not in PATH: %v", err)
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("%s:\n%s", script, stderr.String())
	if err != nil {
		t.Fatalf("%s: %v\nstdout: %s", script, err, stdout.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var sum map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil || sum["ok"] != true {
		t.Fatalf("%s printed %q: %v", script, stdout.String(), err)
	}
	return sum
}

// page serves testdata/page.py in the sandbox and shows it in Chromium,
// full screen, and waits for its window.
func (e *env) page(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	src, err := os.ReadFile("testdata/page.py")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.WriteFile(ctx, id, "/tmp/page.py", bytes.NewReader(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Start(ctx, id, client.ExecRequest{Argv: []string{"python3", "/tmp/page.py"}, Background: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the page's server", time.Minute, func() bool {
		res, err := e.c.Exec(ctx, id, client.ExecRequest{Argv: []string{"python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/')"}, Timeout: 20})
		return err == nil && res.ExitCode == 0
	})
	if _, err := e.c.Start(ctx, id, client.ExecRequest{Argv: []string{"chromium", "--kiosk", "--noerrdialogs", "--user-data-dir=/tmp/chromium-page", "http://127.0.0.1:8000/"}, Background: true}); err != nil {
		t.Fatal(err)
	}
	e.windowRect(t, ctx, id, "airlock-page")
	// Chromium draws the page a little after its window maps.
	waitFor(t, "the page on the screen", 2*time.Minute, func() bool {
		_, img := e.shot(t, ctx, id, nil)
		r, g, b, _ := img.At(50, 50).RGBA() // the page's green background
		return r>>8 < 0x40 && g>>8 > 0x90 && b>>8 > 0x50 && b>>8 < 0x80
	})
}

// testMCP is TestDesktop/MCP.
func testMCP(t *testing.T, e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	id := e.desktop(t, ctx, "native")
	e.do(t, ctx, id, client.ComputerAction{Action: "screen_size"}) // starts the desktop
	e.page(t, ctx, id)
	sum := node(t, ctx, []string{"AIRLOCK_KEY=" + e.key, "SANDBOX_ID=" + id}, "mcp-desktop.mjs", e.s.URL+"/mcp")
	t.Logf("page log: %v", sum["keys"])
}
