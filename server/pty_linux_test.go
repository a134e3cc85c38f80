package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// readTerminal copies a Terminal's output into out until it ends, then
// sends how it ended.
func readTerminal(t *client.Terminal, out *testserver.Output) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(out, t)
		done <- err
	}()
	return done
}

// TestPtyWebSocket drives GET /v1/sandboxes/{id}/pty with a real
// WebSocket client: a login shell on a pseudo-terminal echoes, sees the
// size it was given and resized to, takes Ctrl-C as an interrupt of its
// foreground job, has a colour TERM, and reports `exit 3` as exit code 3.
func TestPtyWebSocket(t *testing.T) {
	e := newE2E(t, "pty")
	sb := e.sandbox(t, client.CreateRequest{})
	defer e.c.Kill(e.ctx, sb.ID)
	term, err := e.c.Terminal(e.ctx, sb.ID, client.TerminalRequest{Cols: 90, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	var out testserver.Output
	ended := readTerminal(term, &out)
	type_ := func(s string) {
		t.Helper()
		if _, err := term.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// $((...)) makes the output differ from the echoed input.
	type_("echo hi-$((40+2)); tty; echo $TERM\n")
	at := out.WaitFor(t, 0, "hi-42")
	at = out.WaitFor(t, at, "/dev/pts/")
	at = out.WaitFor(t, at, "xterm-256color")
	type_("stty size\n")
	at = out.WaitFor(t, at, "30 90")
	if err := term.Resize(120, 40); err != nil {
		t.Fatal(err)
	}
	type_("stty size\n")
	at = out.WaitFor(t, at, "40 120")
	type_("ls --color=auto -d /\n") // colours only on a terminal
	at = out.WaitFor(t, at, "34m/")
	// Ctrl-C interrupts the foreground sleep, and the shell comes back.
	type_("echo sleeping-$((1+1)); sleep 100; echo not-interrupted\n")
	at = out.WaitFor(t, at, "sleeping-2")
	eventually(t, 30*time.Second, "sleep 100 runs in the sandbox", func() bool {
		res, err := e.c.Exec(e.ctx, sb.ID, client.ExecRequest{Shell: `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <$f; echo; done | grep -qx 'sleep 100 '`})
		return err == nil && res.ExitCode == 0
	})
	type_("\x03")
	type_("echo back-$((2+3))\n")
	out.WaitFor(t, at, "back-5")
	if strings.Contains(out.String(), "\nnot-interrupted") {
		t.Fatalf("sleep was not interrupted:\n%q", out.String())
	}
	type_("exit 3\n")
	select {
	case err := <-ended:
		if err != nil { // io.Copy's nil: Read returned io.EOF
			t.Fatalf("terminal ended with %v, not EOF", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("no exit after `exit 3`; output:\n%q", out.String())
	}
	if ex := term.Exit(); ex == nil || ex.Code != 3 {
		t.Fatalf("exit = %+v, want code 3", ex)
	}
}

// TestPtyWebSocketRefusals: the terminal endpoint needs the sandbox's
// key (401 without one, 404 for another key's sandbox), refuses a
// cross-origin WebSocket (a web page's), a bad size, and closing the
// connection kills the command (checked from the host's /proc).
func TestPtyWebSocketRefusals(t *testing.T) {
	e := newE2E(t, "pty-refusals")
	other := newKey(t, e.state, "other")
	sb := e.sandbox(t, client.CreateRequest{})
	defer e.c.Kill(e.ctx, sb.ID)
	u := strings.Replace(e.s.URL, "http", "ws", 1) + "/v1/sandboxes/" + sb.ID + "/pty"
	dial := func(url string, h http.Header) int {
		c, resp, err := websocket.Dial(e.ctx, url, &websocket.DialOptions{HTTPHeader: h})
		if err == nil {
			c.CloseNow()
			return http.StatusSwitchingProtocols
		}
		if resp == nil {
			t.Fatalf("dial %s: %v", url, err)
		}
		return resp.StatusCode
	}
	auth := func(k string) http.Header { return http.Header{"Authorization": {"Bearer " + k}} }
	if st := dial(u, nil); st != 401 {
		t.Errorf("without a key: %d, want 401", st)
	}
	if st := dial(u, auth(other)); st != 404 {
		t.Errorf("another key: %d, want 404", st)
	}
	h := auth(e.key)
	h.Set("Origin", "http://evil.example")
	if st := dial(u, h); st != 403 {
		t.Errorf("cross-origin: %d, want 403", st)
	}
	if st := dial(u+"?cols=0", auth(e.key)); st != 400 {
		t.Errorf("cols=0: %d, want 400", st)
	}
	term, err := e.c.Terminal(e.ctx, sb.ID, client.TerminalRequest{Argv: []string{"sleep", "4243"}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "sleep 4243 runs", func() bool { return testserver.HostRuns("sleep\x004243\x00") })
	term.Close()
	eventually(t, 30*time.Second, "closing the terminal kills sleep 4243", func() bool { return !testserver.HostRuns("sleep\x004243\x00") })
}
