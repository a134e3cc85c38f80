package desktop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/debimage"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// TestBrowserCDP: playwright-core on the host connects over the DevTools
// protocol, through the API's ports relay (a WebSocket authorized by the
// API key), to headless Chromium in a sandbox of the browser image, loads a
// page served inside the sandbox, clicks its field, types, reads the DOM,
// and the page's own log has the keystrokes. Without the key the relay
// refuses the DevTools endpoint. Under native and gVisor.
func TestBrowserCDP(t *testing.T) {
	testserver.NeedRoot(t)
	state := testserver.StateDir(t)
	it.StoreDebImage(t, state, debimage.Browser())
	s := testserver.Start(t, state)
	key := testserver.NewKey(t, state, "browser")
	for _, runtime := range []string{"native", "gvisor"} {
		t.Run(runtime, func(t *testing.T) {
			if _, err := os.Stat("/usr/local/bin/runsc"); err != nil && runtime == "gvisor" {
				t.Skipf("no runsc (scripts/setup.sh installs it): %v", err)
			}
			testBrowserCDP(t, s, key, runtime)
		})
	}
}

func testBrowserCDP(t *testing.T, s *testserver.Server, key, runtime string) {
	c := client.New(s.URL, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, client.CreateRequest{Image: "browser", Timeout: 900, Runtime: runtime,
		Limits: &client.Limits{MemoryBytes: 2 << 30, Pids: 1024, CPUs: 2, DiskBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.Background(), sb.ID)
	ws := startBrowser(t, ctx, s, c, key, sb.ID)
	sum := node(t, ctx, []string{"AIRLOCK_KEY=" + key, "CDP_URL=" + ws}, "browser-cdp.mjs")
	t.Logf("playwright-core over CDP: %v", sum)
	var last []byte
	defer func() {
		if t.Failed() {
			t.Logf("the page's log when the test gave up: %q", last)
		}
	}()
	waitFor(t, "the page's log", time.Minute, func() bool {
		b, err := c.ReadFile(ctx, sb.ID, "/tmp/page.log")
		last = b
		return err == nil && string(b) == "c\nd\np\nEnter\n"
	})
}

// startBrowser serves testdata/page.py on 127.0.0.1:8000 inside sandbox id
// (of the browser image), starts airlock-browser there, waits for
// Chromium's DevTools endpoint through the ports relay, checks that the
// relay refuses it without the API key, and returns the browser's
// DevTools WebSocket URL through the relay. It skips the test when
// tests/desktop/node_modules lacks playwright-core.
func startBrowser(t *testing.T, ctx context.Context, s *testserver.Server, c *client.Client, key, id string) string {
	t.Helper()
	src, err := os.ReadFile("testdata/page.py")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, id, "/tmp/page.py", bytes.NewReader(src), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, argv := range [][]string{{"python3", "/tmp/page.py"}, {"airlock-browser"}} {
		if _, err := c.Start(ctx, id, client.ExecRequest{Argv: argv, Background: true}); err != nil {
			t.Fatal(err)
		}
	}
	relay := s.URL + "/v1/sandboxes/" + id + "/ports/9222"
	get := func(auth string) (int, []byte) {
		req, _ := http.NewRequestWithContext(ctx, "GET", relay+"/json/version", nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		return res.StatusCode, b
	}
	var version struct{ WebSocketDebuggerURL string }
	waitFor(t, "Chromium's DevTools endpoint through the relay", 2*time.Minute, func() bool {
		code, b := get(key)
		return code == 200 && json.Unmarshal(b, &version) == nil && version.WebSocketDebuggerURL != ""
	})
	if code, _ := get(""); code != 401 {
		t.Fatalf("the DevTools endpoint without the API key: %d, want 401", code)
	}
	// ws://127.0.0.1:9222/devtools/browser/UUID, as the sandbox sees it:
	// the same path through the relay.
	_, path, ok := strings.Cut(strings.TrimPrefix(version.WebSocketDebuggerURL, "ws://"), "/")
	if !ok || !strings.HasPrefix(path, "devtools/browser/") {
		t.Fatalf("webSocketDebuggerUrl %q", version.WebSocketDebuggerURL)
	}
	ws := "ws://" + strings.TrimPrefix(relay, "http://") + "/" + path
	if _, err := os.Stat("node_modules/playwright-core"); err != nil {
		t.Skipf("tests/desktop/node_modules lacks playwright-core (scripts/setup.sh --tests runs npm ci there): %v", err)
	}
	return ws
}
