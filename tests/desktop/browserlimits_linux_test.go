package desktop_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// testBrowserTabOOM (TestBrowserSandbox): in a sandbox of the browser
// image with a 1 GiB memory limit, a tab that allocates memory without end
// is an out-of-memory kill of that tab's renderer, not of the sandbox:
// playwright-core sees the tab crash, while the browser, another tab (its
// DOM read and typed into) and a new tab work on; the sandbox counts the
// kill (oom_kills), still runs commands, and Chromium's browser process is
// the same one. Under native and gVisor (where the agent, not the kernel,
// does the killing: agent/memguard_linux.go).
func testBrowserTabOOM(t *testing.T, s *testserver.Server, key, runtime string) {
	c := client.New(s.URL, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, client.CreateRequest{Image: "browser", Timeout: 900, Runtime: runtime,
		Limits: &client.Limits{MemoryBytes: 1 << 30, Pids: 1024, CPUs: 2, DiskBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), sb.ID)
	ws := startBrowser(t, ctx, s, c, key, sb.ID)
	browserPid := func() string {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", "pgrep -o -f remote-debugging-port"}, Timeout: 30})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Chromium's browser process: %+v %v", res, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	before := browserPid()
	m, err := c.Metrics(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	sum := node(t, ctx, []string{"AIRLOCK_KEY=" + key, "CDP_URL=" + ws}, "browser-oom.mjs")
	t.Logf("playwright-core: %v", sum)
	waitFor(t, "the sandbox to count the tab's out-of-memory kill", time.Minute, func() bool {
		after, err := c.Metrics(ctx, sb.ID)
		return err == nil && after.OOMKills > m.OOMKills
	})
	if after := browserPid(); after != before {
		t.Fatalf("Chromium's browser process was %s, is %s: more than the tab died", before, after)
	}
	info, err := c.Get(ctx, sb.ID)
	if err != nil || info.State != "running" {
		t.Fatalf("the sandbox after the tab's OOM: %+v %v", info, err)
	}
}
