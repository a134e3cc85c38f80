package server_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"airlock/client"
)

// termReader collects a Terminal's output in the background.
type termReader struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
	err  error
}

func readTerminal(t *client.Terminal) *termReader {
	r := &termReader{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		b := make([]byte, 4096)
		for {
			n, err := t.Read(b)
			r.mu.Lock()
			r.buf.Write(b[:n])
			if err != nil {
				r.err = err
			}
			r.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return r
}

func (r *termReader) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

// expect waits for want to appear in the output after offset from and
// returns the offset just past it.
func (r *termReader) expect(t *testing.T, from int, want string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := r.String()
		if i := strings.Index(out[min(from, len(out)):], want); i >= 0 {
			return min(from, len(out)) + i + len(want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("terminal output never showed %q; got:\n%q", want, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	out := readTerminal(term)
	type_ := func(s string) {
		t.Helper()
		if _, err := term.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// $((...)) makes the output differ from the echoed input.
	type_("echo hi-$((40+2)); tty; echo $TERM\n")
	at := out.expect(t, 0, "hi-42")
	at = out.expect(t, at, "/dev/pts/")
	at = out.expect(t, at, "xterm-256color")
	type_("stty size\n")
	at = out.expect(t, at, "30 90")
	if err := term.Resize(120, 40); err != nil {
		t.Fatal(err)
	}
	type_("stty size\n")
	at = out.expect(t, at, "40 120")
	type_("ls --color=always -d /\n")
	at = out.expect(t, at, "\x1b[")
	// Ctrl-C interrupts the foreground sleep, and the shell comes back.
	type_("echo sleeping-$((1+1)); sleep 100; echo not-interrupted\n")
	at = out.expect(t, at, "sleeping-2")
	eventually(t, 30*time.Second, "sleep 100 runs in the sandbox", func() bool {
		res, err := e.c.Exec(e.ctx, sb.ID, client.ExecRequest{Shell: `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <$f; echo; done | grep -qx 'sleep 100 '`})
		return err == nil && res.ExitCode == 0
	})
	type_("\x03")
	type_("echo back-$((2+3))\n")
	at = out.expect(t, at, "back-5")
	if strings.Contains(out.String(), "\nnot-interrupted") {
		t.Fatalf("sleep was not interrupted:\n%q", out.String())
	}
	type_("exit 3\n")
	select {
	case <-out.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("no exit after `exit 3`; output:\n%q", out.String())
	}
	if !errors.Is(out.err, io.EOF) {
		t.Fatalf("terminal ended with %v, not EOF", out.err)
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
	eventually(t, 30*time.Second, "sleep 4243 runs", func() bool { return hostRuns("sleep\x004243\x00") })
	term.Close()
	eventually(t, 30*time.Second, "closing the terminal kills sleep 4243", func() bool { return !hostRuns("sleep\x004243\x00") })
}

// hostRuns reports whether a process of the host (any namespace) has
// exactly this NUL-terminated command line.
func hostRuns(cmdline string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(b) == cmdline {
			return true
		}
	}
	return false
}
