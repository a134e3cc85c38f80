package desktop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/debimage"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/store"
)

// humanPolicy holds typing into windows titled *Bank* and, to check that
// an approved action acts on the window it was approved for only, any key
// press into windows titled *Notes*.
const humanPolicy = `{"require": [
  {"action": "computer", "computer_action": "type", "window_title_glob": "*Bank*", "reason": "typing into a bank"},
  {"action": "computer", "computer_action": "key", "window_title_glob": "*Notes*", "reason": "keys into notes"}
]}`

// keylog is a window's own log of the keys it receives: the program an
// xterm runs, writing every byte typed into it to a file.
const keylog = `import os, sys, tty
tty.setraw(0)
with open(sys.argv[1], "ab", buffering=0) as f:
    while True:
        b = os.read(0, 64)
        if not b:
            break
        f.write(b)
`

// humanEnv is a desktop server with an approval policy on computer-use
// actions, an approver key for the human, and the ports relay on an
// origin of its own for the dashboard's desktop view.
type humanEnv struct {
	*env
	human string // the human's (approver) key
	state string // the server's state directory
}

func startHuman(t *testing.T, args ...string) *humanEnv {
	t.Helper()
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policy, []byte(humanPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	testserver.NeedRoot(t)
	state := testserver.StateDir(t)
	it.StoreDebImage(t, state, debimage.Desktop())
	// The human's key is made before the server starts, which names it.
	human := testserver.NewKey(t, state, "human")
	s := testserver.Start(t, state, append([]string{"--approval-policy", policy, "--approver-key", keyIDIn(t, state, "human"),
		"--approval-no-elicitation"}, args...)...)
	key := testserver.NewKey(t, state, "desktop")
	return &humanEnv{env: &env{s: s, key: key, c: client.New(s.URL, key)}, human: human, state: state}
}

func keyIDIn(t *testing.T, state, name string) string {
	t.Helper()
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys, err := st.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.Name == name {
			return k.ID
		}
	}
	t.Fatalf("no key %s", name)
	return ""
}

// window starts an xterm titled title whose program logs the keys it
// gets to log, and waits for it on the screen.
func (e *env) window(t *testing.T, ctx context.Context, id, title, log string) {
	t.Helper()
	if _, err := e.c.WriteFile(ctx, id, "/tmp/keylog.py", strings.NewReader(keylog), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Start(ctx, id, client.ExecRequest{Argv: []string{"xterm", "-xrm", "XTerm*allowTitleOps: false",
		"-geometry", "60x10", "-T", title, "-e", "python3", "/tmp/keylog.py", log}, Background: true}); err != nil {
		t.Fatal(err)
	}
	e.windowRect(t, ctx, id, "^"+title+"$")
}

// desktopWith creates a desktop sandbox on runtime, starts its desktop and
// opens a key-logging xterm (window) for each title, logging to
// logName(title).
func (e *env) desktopWith(t *testing.T, ctx context.Context, runtime string, titles ...string) string {
	t.Helper()
	id := e.desktop(t, ctx, runtime)
	e.do(t, ctx, id, client.ComputerAction{Action: "screen_size"}) // starts the desktop
	e.sh(t, ctx, id, waitPanel)
	for _, title := range titles {
		e.window(t, ctx, id, title, logName(title))
	}
	return id
}

// logName is the key log of the window titled title: /tmp/ and its last
// word in lower case, .log.
func logName(title string) string {
	f := strings.Fields(title)
	return "/tmp/" + strings.ToLower(f[len(f)-1]) + ".log"
}

// focus gives the window titled title the focus and waits until the
// computer-use API reports it focused.
func (e *env) focus(t *testing.T, ctx context.Context, id, title string) {
	t.Helper()
	waitFor(t, "the focus on "+title, time.Minute, func() bool {
		e.c.Exec(ctx, id, client.ExecRequest{Argv: []string{"sh", "-c", `xdotool search --name "$1" windowactivate --sync`, "sh", "^" + title + "$"}, Timeout: 20})
		res, err := e.c.Computer(ctx, id, client.ComputerAction{Action: "active_window"})
		return err == nil && res.Window != nil && res.Window.Title == title
	})
}

// logOf reads a window's key log ("" while it has none).
func (e *env) logOf(t *testing.T, ctx context.Context, id, log string) string {
	t.Helper()
	return e.sh(t, ctx, id, "cat "+log+" 2>/dev/null || true")
}

// pending waits for exactly one pending approval, as the human sees it.
func (h *humanEnv) pending(t *testing.T, ctx context.Context) map[string]any {
	t.Helper()
	var got map[string]any
	waitFor(t, "a pending approval", time.Minute, func() bool {
		var list struct{ Approvals []map[string]any }
		st := h.api(t, ctx, "GET", "/v1/approvals", nil, &list)
		if st != 200 || len(list.Approvals) != 1 {
			return false
		}
		got = list.Approvals[0]
		return true
	})
	return got
}

func (h *humanEnv) answer(t *testing.T, ctx context.Context, id, decision string) {
	t.Helper()
	if st := h.api(t, ctx, "POST", "/v1/approvals/"+id, map[string]string{"decision": decision, "reason": "test"}, nil); st != 200 {
		t.Fatalf("%s %s: HTTP %d", decision, id, st)
	}
}

// api calls the server with the human's key.
func (h *humanEnv) api(t *testing.T, ctx context.Context, method, path string, in, out any) int {
	t.Helper()
	return h.asKey(t, ctx, h.human, method, path, in, out)
}

// asKey calls the server with key.
func (h *humanEnv) asKey(t *testing.T, ctx context.Context, key, method, path string, in, out any) int {
	t.Helper()
	var body bytes.Buffer
	if in != nil {
		json.NewEncoder(&body).Encode(in)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.s.URL+path, &body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// testComputerApprovals: with a rule "hold type into windows titled
// *Bank*", a type into such a window through the API or MCP is held; denied,
// its keys never reach the window (the window's own key log), approved,
// they do; a type into another window passes at once; and an action
// approved for one window does nothing when another has the focus by the
// time it acts.
func testComputerApprovals(t *testing.T, h *humanEnv, runtime string) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	id := h.desktopWith(t, ctx, runtime, "My Bank", "Notes")

	// API: held, denied, nothing typed.
	h.focus(t, ctx, id, "My Bank")
	errc := make(chan error, 1)
	go func() {
		_, err := h.c.Computer(ctx, id, client.ComputerAction{Action: "type", Text: "secret-api"})
		errc <- err
	}()
	p := h.pending(t, ctx)
	if s, _ := p["summary"].(string); !strings.Contains(s, `"My Bank"`) || strings.Contains(s, "secret") {
		t.Fatalf("pending approval's summary %q: want the window's title and not the text", s)
	}
	h.answer(t, ctx, p["id"].(string), "deny")
	var ce *client.Error
	if err := <-errc; !errors.As(err, &ce) || ce.Status != 403 || ce.Code != "approval_denied" {
		t.Fatalf("denied type: %v, want 403 approval_denied", err)
	}

	// MCP (the official Go SDK): held, denied, a tool error, nothing typed.
	tr := &sdk.StreamableClientTransport{Endpoint: h.s.URL + "/mcp", HTTPClient: &http.Client{Transport: bearer{h.key}}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	resc := make(chan *sdk.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "computer", Arguments: map[string]any{"sandbox_id": id, "action": "type", "text": "secret-mcp"}})
		if err != nil {
			t.Errorf("MCP computer: %v", err)
		}
		resc <- res
	}()
	p = h.pending(t, ctx)
	if a, _ := p["action"].(map[string]any); a["via"] != "mcp" || a["computer_action"] != "type" || a["window_title"] != "My Bank" {
		t.Fatalf("pending MCP approval %v", p)
	}
	h.answer(t, ctx, p["id"].(string), "deny")
	if res := <-resc; res == nil || !res.IsError || !strings.Contains(toolText(res), "approval_denied") {
		t.Fatalf("denied MCP type: %+v", res)
	}

	// Approved: the keys reach the window, so the log would have shown
	// the denied ones.
	go func() {
		_, err := h.c.Computer(ctx, id, client.ComputerAction{Action: "type", Text: "approved"})
		errc <- err
	}()
	h.answer(t, ctx, h.pending(t, ctx)["id"].(string), "approve")
	if err := <-errc; err != nil {
		t.Fatalf("approved type: %v", err)
	}
	waitFor(t, "the approved keys in the bank's log", time.Minute, func() bool { return h.logOf(t, ctx, id, "/tmp/bank.log") == "approved" })

	// Another window: no approval asked, the keys arrive.
	h.focus(t, ctx, id, "Notes")
	if _, err := h.c.Computer(ctx, id, client.ComputerAction{Action: "type", Text: "hello"}); err != nil {
		t.Fatalf("type into Notes: %v", err)
	}
	waitFor(t, "the keys in the notes' log", time.Minute, func() bool { return h.logOf(t, ctx, id, "/tmp/notes.log") == "hello" })

	// Approved for Notes, but the bank has the focus when it would act:
	// nothing is typed anywhere.
	go func() {
		_, err := h.c.Computer(ctx, id, client.ComputerAction{Action: "key", Text: "x y z"})
		errc <- err
	}()
	p = h.pending(t, ctx)
	h.focus(t, ctx, id, "My Bank")
	h.answer(t, ctx, p["id"].(string), "approve")
	if err := <-errc; !errors.As(err, &ce) || ce.Status != 409 || ce.Code != "window_changed" {
		t.Fatalf("approved keys after the focus moved: %v, want 409 window_changed", err)
	}
	time.Sleep(2 * time.Second) // let any stray key land before reading the logs
	if got := h.logOf(t, ctx, id, "/tmp/bank.log"); got != "approved" {
		t.Fatalf("the bank's log is %q: keys not approved for it reached it", got)
	}
	if got := h.logOf(t, ctx, id, "/tmp/notes.log"); got != "hello" {
		t.Fatalf("the notes' log is %q", got)
	}
}

func toolText(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestDesktopHuman runs the scenarios where a person is in the loop on
// one server: approvals of computer-use actions, and the dashboard's live
// desktop view.
func TestDesktopHuman(t *testing.T) {
	h := startHuman(t, "--relay-domain", "localhost")
	t.Run("Approvals", func(t *testing.T) { testComputerApprovals(t, h, "native") })
	t.Run("Approvals-gvisor", func(t *testing.T) {
		if _, err := os.Stat("/usr/local/bin/runsc"); err != nil {
			t.Skipf("no runsc (scripts/setup.sh installs it): %v", err)
		}
		testComputerApprovals(t, h, "gvisor")
	})
	t.Run("Links", func(t *testing.T) { testLinkCredentials(t, h) })
	t.Run("DesktopView", func(t *testing.T) { testDesktopView(t, h, "native") })
	t.Run("DesktopView-gvisor", func(t *testing.T) {
		if _, err := os.Stat("/usr/local/bin/runsc"); err != nil {
			t.Skipf("no runsc (scripts/setup.sh installs it): %v", err)
		}
		testDesktopView(t, h, "gvisor")
	})
}
