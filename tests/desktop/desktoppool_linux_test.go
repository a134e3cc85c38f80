package desktop_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// TestDesktopPool: `airlock serve --pool 1 --pool-image desktop` keeps a
// desktop sandbox ready with its desktop already started (Xvfb and the
// XFCE session run before anyone asked), so a create of the desktop
// image is served from the pool and its first screenshot needs no start;
// the pool refills. A display larger than the screenshot cap is refused
// (413). The pool holds sandboxes of the default tier only
// (native): a gVisor desktop starts as before.
func TestDesktopPool(t *testing.T) {
	e := start(t, "--pool", "1", "--pool-image", "desktop")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	full := func() bool {
		info, err := e.c.Info(ctx)
		return err == nil && info.PoolIdle >= 2 // the default pool's and the desktop's
	}
	waitFor(t, "the warm pool to fill", 5*time.Minute, full)
	sb, err := e.c.Create(ctx, client.CreateRequest{Image: "desktop", Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Kill(context.Background(), sb.ID)
	// Before any computer-use action: the display and the session run.
	if ps := e.sh(t, ctx, sb.ID, "ps -eo comm"); !strings.Contains(ps, "Xvfb") || !strings.Contains(ps, "xfce4-session") {
		t.Fatalf("a desktop sandbox from the pool, before any action: no Xvfb or XFCE session:\n%s", ps)
	}
	shot, img := e.shot(t, ctx, sb.ID, nil)
	if shot.Screen.Width != 1024 || img.Bounds().Dx() != 1024 {
		t.Fatalf("first screenshot of a pooled desktop: %+v", shot.Screen)
	}
	// One display: the action did not start a second desktop.
	if n := strings.Count(e.sh(t, ctx, sb.ID, "ps -eo comm"), "Xvfb"); n != 1 {
		t.Fatalf("%d Xvfb processes after the first screenshot, want 1", n)
	}

	// The screenshot size cap: a display wider than 4096 pixels (here a
	// second Xvfb the sandbox started itself) is refused, never read.
	if _, err := e.c.Start(ctx, sb.ID, client.ExecRequest{Argv: []string{"Xvfb", ":1", "-screen", "0", "4200x64x24", "-nolisten", "tcp", "-nolisten", "unix"}, Background: true}); err != nil {
		t.Fatal(err)
	}
	e.sh(t, ctx, sb.ID, "timeout 60 sh -c 'until DISPLAY=:1 xdpyinfo >/dev/null 2>&1; do sleep 0.2; done'")
	_, err = e.c.Computer(ctx, sb.ID, client.ComputerAction{Action: "screenshot", Display: ":1"})
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != 413 || ae.Code != "too_large" || !strings.Contains(ae.Message, "4096") {
		t.Fatalf("a screenshot of a 4200x64 display: %v, want 413 too_large", err)
	}
	waitFor(t, "the warm pool to refill", 5*time.Minute, full)
}
