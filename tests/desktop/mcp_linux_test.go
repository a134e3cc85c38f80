package desktop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
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
// full screen, waits for its window and returns where its text field is.
func (e *env) page(t *testing.T, ctx context.Context, id string) image.Rectangle {
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
	// Chromium draws the page a little after its window maps (and may
	// show an info bar above it): find the white field on the green page.
	// A window Chromium has mapped but not yet drawn is white all over
	// (seen in CI: the "field" was the whole screen, and the click landed
	// on nothing): the field is a box the page's green surrounds.
	var field image.Rectangle
	waitFor(t, "the page's text field on the screen", 2*time.Minute, func() bool {
		_, img := e.shot(t, ctx, id, nil)
		field = whiteBox(img)
		return field.Dx() >= 300 && field.Dy() >= 40 && greenAround(img, field)
	})
	t.Logf("the page's field is at %v", field)
	return field
}

// greenAround reports whether the page's background (#2a6) shows just
// outside box on each of its four sides.
func greenAround(img image.Image, box image.Rectangle) bool {
	green := func(x, y int) bool {
		if !(image.Point{x, y}).In(img.Bounds()) {
			return false
		}
		r, g, b, _ := img.At(x, y).RGBA()
		return r>>8 < 0x60 && g>>8 > 0x80 && b>>8 > 0x40 && b>>8 < 0x90
	}
	cx, cy := (box.Min.X+box.Max.X)/2, (box.Min.Y+box.Max.Y)/2
	return green(box.Min.X-5, cy) && green(box.Max.X+5, cy) && green(cx, box.Min.Y-5) && green(cx, box.Max.Y+5)
}

// whiteBox is the bounding box of the rows that have a run of at least
// 300 white pixels: the page's text field.
func whiteBox(img image.Image) image.Rectangle {
	var box image.Rectangle
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		run, start := 0, 0
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r>>8 >= 0xf0 && g>>8 >= 0xf0 && bl>>8 >= 0xf0 {
				if run == 0 {
					start = x
				}
				run++
				if run >= 300 {
					box = box.Union(image.Rect(start, y, x+1, y+1))
				}
			} else {
				run = 0
			}
		}
	}
	return box
}

// testMCP is TestDesktop/MCP on runtime.
func testMCP(t *testing.T, e *env, runtime string) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	id := e.desktop(t, ctx, runtime)
	e.do(t, ctx, id, client.ComputerAction{Action: "screen_size"}) // starts the desktop
	field := e.page(t, ctx, id)
	centre := fmt.Sprintf("%d,%d", (field.Min.X+field.Max.X)/2, (field.Min.Y+field.Max.Y)/2)
	sum := node(t, ctx, []string{"AIRLOCK_KEY=" + e.key, "SANDBOX_ID=" + id, "FIELD=" + centre}, "mcp-desktop.mjs", e.s.URL+"/mcp")
	t.Logf("page log: %v", sum["keys"])
}
