// Package desktop_test drives sandboxes of the desktop image (package
// debimage) end to end: airlock's computer-use API over HTTP, MCP clients
// (the official TypeScript SDK) and E2B Desktop's SDK, each against a real
// `airlock serve`.
package desktop_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/debimage"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// env is a server whose image store has the desktop image, published.
type env struct {
	s   *testserver.Server
	key string
	c   *client.Client
}

func start(t *testing.T, args ...string) *env {
	t.Helper()
	testserver.NeedRoot(t)
	state := testserver.StateDir(t)
	it.StoreDebImage(t, state, debimage.Desktop())
	s := testserver.Start(t, state, args...)
	key := testserver.NewKey(t, state, "desktop")
	return &env{s: s, key: key, c: client.New(s.URL, key)}
}

// desktop creates a sandbox of the desktop image on runtime.
func (e *env) desktop(t *testing.T, ctx context.Context, runtime string) string {
	t.Helper()
	sb, err := e.c.Create(ctx, client.CreateRequest{Image: "desktop", Runtime: runtime, Timeout: 1200,
		Limits: &client.Limits{MemoryBytes: 3 << 30, Pids: 2048, CPUs: 2, DiskBytes: 2 << 30}})
	if err != nil {
		t.Fatalf("create a %s desktop sandbox: %v", runtime, err)
	}
	t.Cleanup(func() { e.c.Kill(context.Background(), sb.ID) })
	return sb.ID
}

func decodePNG(t *testing.T, b []byte) image.Image {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot is not a PNG (%d bytes): %v", len(b), err)
	}
	return img
}

func (e *env) shot(t *testing.T, ctx context.Context, id string, scale *client.Size) (*client.ComputerResult, image.Image) {
	t.Helper()
	res, err := e.c.Computer(ctx, id, client.ComputerAction{Action: "screenshot", Scale: scale})
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if res.Image == nil || res.Image.MediaType != "image/png" {
		t.Fatalf("screenshot without an image: %+v", res)
	}
	img := decodePNG(t, res.Image.Data)
	if b := img.Bounds(); b.Dx() != res.Image.Width || b.Dy() != res.Image.Height {
		t.Fatalf("PNG is %v, the answer says %dx%d", b, res.Image.Width, res.Image.Height)
	}
	return res, img
}

func (e *env) do(t *testing.T, ctx context.Context, id string, a client.ComputerAction) *client.ComputerResult {
	t.Helper()
	res, err := e.c.Computer(ctx, id, a)
	if err != nil {
		t.Fatalf("%s: %v", a.Action, err)
	}
	return res
}

func (e *env) sh(t *testing.T, ctx context.Context, id, cmd string) string {
	t.Helper()
	res, err := e.c.Exec(ctx, id, client.ExecRequest{Argv: []string{"/bin/sh", "-c", cmd}, Timeout: 120})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%s: %+v %v", cmd, res, err)
	}
	return res.Stdout
}

// waitFor polls cond every 250 ms until it is true or the deadline.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// differing counts the pixels that differ between a and b inside r.
func differing(a, b image.Image, r image.Rectangle) int {
	n := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			r1, g1, b1, _ := a.At(x, y).RGBA()
			r2, g2, b2, _ := b.At(x, y).RGBA()
			if r1 != r2 || g1 != g2 || b1 != b2 {
				n++
			}
		}
	}
	return n
}

// waitPanel waits for XFCE's panel to be on the screen.
const waitPanel = "timeout 110 sh -c 'until xdotool search --onlyvisible --class xfce4-panel >/dev/null 2>&1; do sleep 0.5; done'"

// windowRect waits for a window whose title matches title (a regular
// expression, as xdotool search takes it) and returns where it is on the
// screen (xwininfo's absolute position: xdotool's getwindowgeometry counts
// the window manager's frame twice).
func (e *env) windowRect(t *testing.T, ctx context.Context, id, title string) image.Rectangle {
	t.Helper()
	var out string
	waitFor(t, "window "+title, 2*time.Minute, func() bool {
		res, err := e.c.Exec(ctx, id, client.ExecRequest{Argv: []string{"sh", "-c", `w=$(xdotool search --onlyvisible --name "$1" | head -n1) && [ -n "$w" ] && xwininfo -id "$w"`, "sh", title}, Timeout: 20})
		if err != nil || res.ExitCode != 0 {
			return false
		}
		out = res.Stdout
		return true
	})
	v := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		if k, s, ok := strings.Cut(strings.TrimSpace(l), ":"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(s))
			v[k] = n
		}
	}
	x, y := v["Absolute upper-left X"], v["Absolute upper-left Y"]
	r := image.Rect(x, y, x+v["Width"], y+v["Height"])
	if r.Dx() < 50 || r.Dy() < 50 {
		t.Fatalf("window %s: xwininfo %q", title, out)
	}
	return r
}

// TestDesktop runs the desktop scenarios on one server (with
// --e2b-domain) whose image store has the desktop image, published:
// storing it takes minutes, so they share it.
//
// API: airlock's own computer-use API on a native desktop sandbox. The
// first screenshot starts the image's desktop; a screenshot before and
// after typing into an xterm differ inside the xterm's window and the typed
// command ran (its file exists); scaling, the pointer, every action, the
// refusals of hostile or oversized input and the screenshot rate cap.
//
// MCP: an MCP client (the official TypeScript SDK) takes a screenshot,
// clicks the text field of a page served inside the sandbox, types, and
// the page's own log shows the keystrokes.
//
// E2B: E2B Desktop's SDK, unchanged (testE2BDesktop).
func TestDesktop(t *testing.T) {
	e := start(t, "--e2b-domain", e2bDomain)
	t.Run("API", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		testComputerUse(t, ctx, e, e.desktop(t, ctx, "native"))
	})
	t.Run("API-gvisor", func(t *testing.T) {
		if _, err := os.Stat("/usr/local/bin/runsc"); err != nil {
			t.Skipf("no runsc (scripts/setup.sh installs it): %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		testComputerUse(t, ctx, e, e.desktop(t, ctx, "gvisor"))
	})
	t.Run("MCP", func(t *testing.T) { testMCP(t, e, "native") })
	t.Run("MCP-gvisor", func(t *testing.T) {
		if _, err := os.Stat("/usr/local/bin/runsc"); err != nil {
			t.Skipf("no runsc (scripts/setup.sh installs it): %v", err)
		}
		testMCP(t, e, "gvisor")
	})
	t.Run("E2B", func(t *testing.T) { testE2BDesktop(t, e) })
	t.Run("E2B-gvisor", func(t *testing.T) {
		if _, err := os.Stat("/usr/local/bin/runsc"); err != nil {
			t.Skipf("no runsc (scripts/setup.sh installs it): %v", err)
		}
		// E2B's create names no runtime: a server whose default is gVisor.
		testE2BDesktop(t, start(t, "--e2b-domain", e2bDomain, "--default-runtime", "gvisor"))
	})
}

func testComputerUse(t *testing.T, ctx context.Context, e *env, id string) {
	first, _ := e.shot(t, ctx, id, nil)
	if first.Screen.Width != 1024 || first.Screen.Height != 768 || first.Image.Width != 1024 {
		t.Fatalf("first screenshot: screen %+v image %dx%d", first.Screen, first.Image.Width, first.Image.Height)
	}
	// Scaled: the picture fits the box, keeping the aspect ratio, and
	// coordinates are read in it.
	small, _ := e.shot(t, ctx, id, &client.Size{Width: 512, Height: 512})
	if small.Image.Width != 512 || small.Image.Height != 384 {
		t.Fatalf("scaled screenshot %dx%d, want 512x384", small.Image.Width, small.Image.Height)
	}
	if res := e.do(t, ctx, id, client.ComputerAction{Action: "mouse_move", Coordinate: &client.Point{X: 50, Y: 60}, Scale: &client.Size{Width: 512, Height: 384}}); *res.Cursor != (client.Point{X: 50, Y: 60}) {
		t.Fatalf("scaled pointer at %+v", res.Cursor)
	}
	if res := e.do(t, ctx, id, client.ComputerAction{Action: "cursor_position"}); *res.Cursor != (client.Point{X: 100, Y: 120}) {
		t.Fatalf("pointer at %+v, want (100, 120) on the screen", res.Cursor)
	}

	// XFCE's panel maps (and its settings daemon applies the keyboard
	// map) a little after the display answers: typing before can lose keys.
	// (A search can fail on a window that goes away meanwhile: it retries.)
	e.sh(t, ctx, id, waitPanel)

	// An xterm running bash; the window's region before and after typing.
	e.sh(t, ctx, id, "rm -f /tmp/typed.txt /tmp/pwned")
	if _, err := e.c.Start(ctx, id, client.ExecRequest{Argv: []string{"xterm", "-T", "airlock-term", "-geometry", "70x12+150+120", "-e", "bash", "--norc"}, Background: true}); err != nil {
		t.Fatal(err)
	}
	win := e.windowRect(t, ctx, id, "airlock-term")
	centre := client.Point{X: (win.Min.X + win.Max.X) / 2, Y: (win.Min.Y + win.Max.Y) / 2}
	e.do(t, ctx, id, client.ComputerAction{Action: "left_click", Coordinate: &centre})
	time.Sleep(time.Second) // let the window take focus and draw; the comparison below does not depend on it
	_, before := e.shot(t, ctx, id, nil)
	// Text that a shell would act on: it is typed, not run, by the way in.
	e.do(t, ctx, id, client.ComputerAction{Action: "type", Text: "$(touch /tmp/pwned) `touch /tmp/pwned`"})
	e.do(t, ctx, id, client.ComputerAction{Action: "key", Text: "ctrl+u"})
	e.do(t, ctx, id, client.ComputerAction{Action: "type", Text: "echo typed-by-airlock > /tmp/typed.txt"})
	e.do(t, ctx, id, client.ComputerAction{Action: "key", Text: "Return"})
	waitFor(t, "the typed command's file", time.Minute, func() bool {
		b, err := e.c.ReadFile(ctx, id, "/tmp/typed.txt")
		return err == nil && string(b) == "typed-by-airlock\n"
	})
	if _, err := e.c.ReadFile(ctx, id, "/tmp/pwned"); err == nil {
		t.Fatal("typed text was run by a shell on its way to the window")
	}
	var after image.Image
	waitFor(t, "the typed text on the screen", time.Minute, func() bool {
		_, after = e.shot(t, ctx, id, nil)
		return differing(before, after, win) > 200
	})
	outside := image.Rect(0, 0, win.Min.X, win.Min.Y) // above and left of the window
	t.Logf("pixels changed: %d in the window %v, %d in %v", differing(before, after, win), win, differing(before, after, outside), outside)

	// Every other action answers.
	for _, a := range []client.ComputerAction{
		{Action: "double_click", Coordinate: &centre},
		{Action: "triple_click", Coordinate: &centre},
		{Action: "right_click", Coordinate: &client.Point{X: 900, Y: 700}},
		{Action: "key", Text: "Escape"},
		{Action: "middle_click"},
		{Action: "scroll", Coordinate: &centre, ScrollDirection: "up", ScrollAmount: 2},
		{Action: "left_click_drag", StartCoordinate: &client.Point{X: 10, Y: 700}, Coordinate: &client.Point{X: 30, Y: 710}},
		{Action: "left_mouse_down"}, {Action: "left_mouse_up"},
		{Action: "hold_key", Text: "shift", Duration: 0.2},
		{Action: "wait", Duration: 0.1},
		{Action: "screen_size"},
	} {
		if res := e.do(t, ctx, id, a); res.Screen.Width != 1024 || res.Cursor == nil {
			t.Fatalf("%s: %+v", a.Action, res)
		}
	}

	// Hostile or oversized input is refused before anything runs.
	for _, a := range []client.ComputerAction{
		{Action: "key", Text: "exec"},               // an xdotool command, not a key
		{Action: "key", Text: "a;touch /tmp/pwned"}, // not a key name
		{Action: "key", Text: "--help"},
		{Action: "type", Text: "a\x00b"},
		{Action: "type", Text: strings.Repeat("x", 5000)},
		{Action: "screenshot", Scale: &client.Size{Width: 5000, Height: 5000}},
		{Action: "mouse_move", Coordinate: &client.Point{X: -1, Y: 5}},
		{Action: "wait", Duration: 60},
		{Action: "scroll", ScrollDirection: "sideways"},
		{Action: "shell"},
		{Action: "screenshot", Display: ":0;id"},
	} {
		_, err := e.c.Computer(ctx, id, a)
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Status != 400 {
			t.Fatalf("%s %q: %v, want a 400", a.Action, a.Text, err)
		}
	}
	if _, err := e.c.ReadFile(ctx, id, "/tmp/pwned"); err == nil {
		t.Fatal("a refused action ran something")
	}

	// The screenshot rate is capped: 11 take at least a second.
	t0 := time.Now()
	for range 11 {
		e.shot(t, ctx, id, &client.Size{Width: 64, Height: 64})
	}
	if d := time.Since(t0); d < time.Second {
		t.Fatalf("11 screenshots in %v: the rate is not capped", d)
	}
	// A frozen X server: the action times out (504) instead of hanging,
	// leaves no xdotool behind, and the desktop answers again once the
	// server runs.
	e.sh(t, ctx, id, "pkill -STOP -x Xvfb")
	_, err := e.c.Computer(ctx, id, client.ComputerAction{Action: "cursor_position"})
	e.sh(t, ctx, id, "pkill -CONT -x Xvfb")
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != 504 {
		t.Fatalf("an action on a frozen display: %v, want a 504", err)
	}
	if left := e.sh(t, ctx, id, "pgrep -x xdotool || true"); left != "" {
		t.Fatalf("xdotool processes left after the timeout: %q", left)
	}
	e.do(t, ctx, id, client.ComputerAction{Action: "cursor_position"})
	fmt.Fprintln(os.Stderr, "computer use: ok")
}

// TestComputerUseNoDisplay: a sandbox without a display (the host-derived
// root) answers 409 no_display, and nothing is started in it.
func TestComputerUseNoDisplay(t *testing.T) {
	testserver.NeedRoot(t)
	state := testserver.StateDir(t)
	s := testserver.Start(t, state)
	c := client.New(s.URL, testserver.NewKey(t, state, "nodisplay"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.ID)
	_, err = c.Computer(ctx, sb.ID, client.ComputerAction{Action: "screenshot"})
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != 409 || ae.Code != "no_display" {
		t.Fatalf("screenshot without a display: %v, want 409 no_display", err)
	}
}
