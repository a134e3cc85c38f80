package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testbrowser"
)

// browser is a headless Chromium on a fresh profile that records console
// errors, uncaught exceptions and CSP violations (package testbrowser).
type browser struct {
	ctx context.Context
	tb  *testbrowser.Browser
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	tb := testbrowser.Start(t, 90*time.Second)
	return &browser{ctx: tb.Ctx, tb: tb}
}

func (b *browser) run(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitText waits until the element sel's text contains sub.
func (b *browser) waitText(t *testing.T, sel, sub string) {
	t.Helper()
	qs, _ := json.Marshal(sel)
	qsub, _ := json.Marshal(sub)
	b.waitJS(t, fmt.Sprintf(`(() => { const e = document.querySelector(%s); return !!e && e.textContent.replace(/\u00a0/g, " ").includes(%s); })()`, qs, qsub),
		fmt.Sprintf(`(document.querySelector(%s)||{}).textContent||""`, qs), fmt.Sprintf("%q in %s", sub, sel))
}

// waitJS waits until expr is true; show is evaluated for the failure
// message.
func (b *browser) waitJS(t *testing.T, expr, show, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		got, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](show))
		t.Fatalf("waiting for %s: %v (the page holds %q)", what, err, got)
	}
}

// termRows is the terminal's screen, one string per row.
const termRows = `[...document.querySelectorAll("#terminal .xterm-rows > div")].map(r => r.textContent.replace(/\u00a0/g, " ").trimEnd())`

// shot saves a screenshot into $AIRLOCK_DASHBOARD_SHOTS (docs/dashboard
// when regenerating the docs) and checks the page is not blank.
func (b *browser) shot(t *testing.T, name string) {
	t.Helper()
	text, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.getElementById("main").innerText`))
	if err != nil {
		t.Fatalf("page %s: %v", name, err)
	}
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if len(strings.TrimSpace(text)) < 20 {
		t.Errorf("page %s is (nearly) blank: %q", name, text)
	}
	if dir := os.Getenv("AIRLOCK_DASHBOARD_SHOTS"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// typeLine types a line into the terminal and presses Enter. The text goes
// in as one input event (Input.insertText, as a paste or an IME does) and
// Enter as a raw key down and up: SendKeys's key events (keydown with
// text, then char) reach xterm.js twice.
func (b *browser) typeLine(line string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(chromedp.Focus(chromedp.CSS(".xterm-helper-textarea")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			if _, err := cdp.Call(ctx, tg, input.InsertText, input.InsertTextParams{Text: line}); err != nil {
				return err
			}
			for _, typ := range []input.DispatchKeyEventType{input.DispatchKeyEventTypeRawKeyDown, input.DispatchKeyEventTypeKeyUp} {
				if _, err := cdp.Call(ctx, tg, input.DispatchKeyEvent, input.DispatchKeyEventParams{Type: typ,
					Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13}); err != nil {
					return err
				}
			}
			return nil
		}))
}

func (b *browser) noErrors(t *testing.T) {
	t.Helper()
	for _, e := range b.tb.Errors() {
		t.Errorf("browser: %s", e)
	}
}

// TestDashboardInBrowser drives the dashboard in headless Chromium against
// a real server: log in with a key, create a sandbox with the button (an
// allowlist of example.com), see it listed, run `echo hi` in the terminal,
// upload a file and see it listed, see a denied host in the network log,
// look at the server page, kill the sandbox and see it go. No page may be
// blank or log a console error (a CSP violation included).
func TestDashboardInBrowser(t *testing.T) {
	e := newE2E(t, "dash")
	b := newBrowser(t)
	base := e.s.URL

	b.run(t, "open", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("key")))
	b.shot(t, "login")
	b.run(t, "log in", chromedp.SendKeys(chromedp.ID("key"), e.key), chromedp.Click(chromedp.CSS(`#login button[type=submit]`)))
	b.waitText(t, "#who", "key ")

	b.run(t, "create", chromedp.WaitVisible(chromedp.ID("create")), chromedp.SendKeys(chromedp.ID("allow"), "example.com"),
		chromedp.Click(chromedp.ID("create")))
	b.waitText(t, "#main .toolbar", "created sb-")
	status, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS("#main .toolbar span.muted")))
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(status), "created "))
	if !strings.HasPrefix(id, "sb-") {
		t.Fatalf("create said %q", status)
	}
	sb, err := e.c.Get(e.ctx, id)
	if err != nil || sb.State != "running" {
		t.Fatalf("the server does not know sandbox %s as running: %+v, %v", id, sb, err)
	}
	b.waitText(t, "#sandboxes", id)
	b.waitText(t, `#sandboxes tr[data-id="`+id+`"]`, "(default)") // its image: none given
	// CPU and memory sparklines drawn from a few metrics polls.
	b.waitJS(t, `[...document.querySelectorAll("#sandboxes polyline")].filter(p => p.getAttribute("points").split(" ").length >= 3).length >= 2`,
		`document.getElementById("sandboxes").innerHTML`, "CPU and memory sparklines of three samples")
	// The filter hides what does not match and shows what does.
	rowN := `document.querySelectorAll('#sandboxes tr[data-id="` + id + `"]').length`
	b.run(t, "filter out", chromedp.SendKeys(chromedp.ID("filter"), "no-such-sandbox"))
	b.waitJS(t, rowN+` === 0`, `document.getElementById("sandboxes").textContent`, "the filter to hide the sandbox")
	if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.getElementById("filter").value = ""; true`)); err != nil {
		t.Fatal(err)
	}
	b.run(t, "filter in", chromedp.SendKeys(chromedp.ID("filter"), id[3:9]))
	b.waitJS(t, rowN+` === 1`, `document.getElementById("sandboxes").textContent`, "the filter to show the sandbox")
	b.shot(t, "sandboxes")

	b.run(t, "open sandbox", chromedp.Click(chromedp.CSS(`#sandboxes a[href="#/sb/`+id+`"]`)), chromedp.WaitReady(chromedp.CSS(".xterm-helper-textarea")))
	// The terminal is a shell on the sandbox's PTY (GET .../pty).
	b.waitJS(t, `document.getElementById("terminal").dataset.mode === "pty"`, `document.getElementById("terminal").dataset.mode || "(none)"`, "the PTY terminal")
	b.waitJS(t, termRows+`.some(l => l.endsWith("$"))`, termRows+`.join("\n")`, "the shell's prompt")
	b.run(t, "type in the terminal", b.typeLine("echo hi"))
	// The command's echo, then its output on a row of its own.
	b.waitJS(t, `(() => { const r = `+termRows+`; const i = r.findIndex(l => l.endsWith("$ echo hi")); return i >= 0 && r[i+1] === "hi"; })()`,
		termRows+`.join("\n")`, "hi under echo hi in the terminal")
	b.run(t, "reach a denied host", b.typeLine("curl -s -m 5 http://denied.test/"))
	b.waitText(t, "#netlog", "denied.test")
	b.waitText(t, "#netlog", "denied")

	up := filepath.Join(t.TempDir(), "dash-upload.txt")
	if err := os.WriteFile(up, []byte("uploaded from the browser\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b.run(t, "upload", chromedp.SetUploadFiles(chromedp.ID("upload"), []string{up}))
	b.waitText(t, "#files", "dash-upload.txt")
	// The file is in the sandbox (checked through the API, not the page).
	got, err := e.c.ReadFile(e.ctx, id, "/workspace/dash-upload.txt")
	if err != nil || string(got) != "uploaded from the browser\n" {
		t.Fatalf("uploaded file in the sandbox: %q, %v", got, err)
	}
	// A background process's output, through the processes table.
	if _, err := e.c.Start(e.ctx, id, client.ExecRequest{Shell: "echo from-the-background", Tag: "bg"}); err != nil {
		t.Fatal(err)
	}
	b.waitText(t, "#processes", "echo from-the-background")
	b.run(t, "show output", chromedp.Click(chromedp.CSS(`#processes tr[data-tag="bg"] button.output`)))
	b.waitText(t, "#proc-output", "from-the-background")
	// Kill a running process from its row; the agent reports it ended.
	if _, err := e.c.Start(e.ctx, id, client.ExecRequest{Shell: "sleep 300", Tag: "sleeper"}); err != nil {
		t.Fatal(err)
	}
	// A destructive action asks first: one click arms it, a second does it.
	b.run(t, "kill a process", chromedp.Click(chromedp.CSS(`#processes tr[data-tag="sleeper"] button.sigkill`)))
	b.waitText(t, `#processes tr[data-tag="sleeper"] button.sigkill`, "Really kill?")
	b.run(t, "confirm the kill", chromedp.Click(chromedp.CSS(`#processes tr[data-tag="sleeper"] button.sigkill`)))
	b.waitJS(t, `(() => { const r = document.querySelector('#processes tr[data-tag="sleeper"]'); return !!r && r.children[3].textContent === "no"; })()`,
		`document.getElementById("processes").textContent`, "the killed process to be reported ended")
	// A Python cell in the sandbox's default context.
	b.run(t, "run a cell", chromedp.SendKeys(chromedp.ID("code-src"), "x = 6\nprint(x * 7)"), chromedp.Click(chromedp.ID("code-run")))
	b.waitText(t, "#code-output", "42")
	b.waitText(t, "#contexts", "python")
	b.waitText(t, "#audit", "sandbox.create")
	b.waitText(t, "#policy", "example.com")
	b.shot(t, "sandbox")

	b.run(t, "server page", chromedp.Navigate(base+"/#/server"))
	b.waitText(t, "#capacity", "Ceiling: memory")
	b.waitText(t, "#capacity", "(dash)") // the key's name, from the session
	b.waitText(t, "#capacity", "Key quota: running sandboxes")
	b.waitText(t, "#server-audit", id)
	b.waitJS(t, `[...document.querySelectorAll("#totals polyline")].some(p => p.getAttribute("points").split(" ").length >= 3)`,
		`document.getElementById("totals").textContent`, "totals over three polls")
	b.shot(t, "server")

	b.run(t, "back to the list", chromedp.Navigate(base+"/#/"))
	b.waitText(t, "#sandboxes", id)
	row := `#sandboxes tr[data-id="` + id + `"]`
	b.run(t, "pause", chromedp.Click(chromedp.CSS(row+` button.pause`)))
	b.waitText(t, row, "paused")
	if sb, err := e.c.Get(e.ctx, id); err != nil || !sb.Paused {
		t.Fatalf("after Pause the server says %+v, %v", sb, err)
	}
	b.run(t, "resume", chromedp.Click(chromedp.CSS(row+` button.resume`)))
	b.waitJS(t, `!!document.querySelector('`+row+` button.pause')`, `document.getElementById("sandboxes").textContent`, "the sandbox resumed")
	if sb, err := e.c.Get(e.ctx, id); err != nil || sb.Paused {
		t.Fatalf("after Resume the server says %+v, %v", sb, err)
	}
	b.run(t, "kill (armed)", chromedp.Click(chromedp.CSS(row+` button.kill`)))
	b.waitText(t, row+` button.kill`, "Really kill?")
	if sb, err := e.c.Get(e.ctx, id); err != nil || sb.State != "running" {
		t.Fatalf("one click on Kill (not confirmed) killed the sandbox: %+v, %v", sb, err)
	}
	b.run(t, "kill (confirmed)", chromedp.Click(chromedp.CSS(row+` button.kill`)))
	eventually(t, 30*time.Second, "the sandbox to leave the running list", func() bool {
		n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`document.querySelectorAll('#sandboxes tr[data-id="`+id+`"]').length`))
		return err == nil && n == 0
	})
	if sb, err := e.c.Get(e.ctx, id); err != nil || sb.State == "running" {
		t.Fatalf("after kill the server says %+v, %v", sb, err)
	}
	// Unticking "running only" lists the ended sandbox too.
	b.run(t, "show ended", chromedp.Click(chromedp.ID("running")))
	b.waitText(t, row, "killed")

	// The create form: image, runtime, profile, memory, timeout.
	b.run(t, "create with options", chromedp.SendKeys(chromedp.ID("new-memory"), "200"), chromedp.SendKeys(chromedp.ID("new-timeout"), "300"),
		chromedp.SetValue(chromedp.ID("new-profile"), "standard"), chromedp.Click(chromedp.ID("create")))
	b.waitText(t, "#main .toolbar", "created sb-")
	status, err = chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS("#main .toolbar span.muted")))
	if err != nil {
		t.Fatal(err)
	}
	id2 := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(status), "created "))
	if sb, err := e.c.Get(e.ctx, id2); err != nil || sb.Profile != "standard" || sb.State != "running" {
		t.Fatalf("the form's sandbox: %+v, %v", sb, err)
	}

	// Volumes: create one from the page and delete it (confirmed).
	b.run(t, "volumes page", chromedp.Navigate(base+"/#/volumes"))
	b.waitText(t, "#volumes", "no volumes yet")
	b.run(t, "create a volume", chromedp.SendKeys(chromedp.ID("vol-name"), "dashvol"), chromedp.SendKeys(chromedp.ID("vol-size"), "16"), chromedp.Click(chromedp.ID("vol-create")))
	b.waitText(t, "#volumes", "dashvol")
	b.shot(t, "volumes")
	b.run(t, "delete the volume", chromedp.Click(chromedp.CSS(`#volumes tr[data-name="dashvol"] button.delete`)), chromedp.Click(chromedp.CSS(`#volumes tr[data-name="dashvol"] button.delete`)))
	b.waitText(t, "#volumes", "no volumes yet")
	// Images, templates and approvals render with their empty states.
	b.run(t, "images page", chromedp.Navigate(base+"/#/images"))
	b.waitText(t, "#images", "no images")
	b.run(t, "templates page", chromedp.Navigate(base+"/#/templates"), chromedp.WaitVisible(chromedp.ID("tpl-dockerfile")))
	b.shot(t, "templates")
	b.run(t, "approvals page", chromedp.Navigate(base+"/#/approvals"))
	b.waitText(t, "#approvals", "nothing is waiting")

	// A phone's width: nothing wider than the screen on any page.
	b.run(t, "narrow", chromedp.EmulateViewport(390, 844))
	for _, page := range []string{"/#/", "/#/sb/" + id2, "/#/images", "/#/templates", "/#/volumes", "/#/approvals", "/#/server"} {
		b.run(t, "narrow "+page, chromedp.Navigate(base+page))
		b.waitJS(t, `document.querySelector("#main").innerText.length > 20 && !document.querySelector("#main .loading")`,
			`document.querySelector("#main").innerText`, "page "+page+" loaded")
		b.waitJS(t, `document.documentElement.scrollWidth <= window.innerWidth + 1`,
			`document.documentElement.scrollWidth + " > " + window.innerWidth`, "page "+page+" to fit 390 px")
		if page == "/#/" || page == "/#/sb/"+id2 {
			name := "narrow-sandboxes"
			if page != "/#/" {
				name = "narrow-sandbox"
			}
			b.shot(t, name)
		}
	}
	b.noErrors(t)
}
