package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/image/draw"
	"golang.org/x/time/rate"
)

// Computer use runs the X tools of the sandbox's image (xdotool, scrot) as
// the workload's own processes: the same user, capabilities and cgroup as
// any command, started with an argv (never a shell), each bounded in time
// and output. What they print is as untrusted as anything else from the
// sandbox; the agent parses it strictly and decodes a screenshot only
// after checking its size.

// toolTimeout bounds one tool run; typing gets longer (xdotool types a
// key every typeDelay).
const (
	toolTimeout = 15 * time.Second
	typeDelayMs = 8
	maxToolOut  = MaxShotBytes
)

// helperExits maps the pids of tool runs to where the reaper reports
// their exit (reapAll calls helperExited for a pid that is not a proc).
var (
	helperMu    sync.Mutex
	helperExits = map[int]chan syscall.WaitStatus{}
)

// helperExited delivers a reaped tool run's status.
func helperExited(pid int, ws syscall.WaitStatus) {
	helperMu.Lock()
	ch := helperExits[pid]
	delete(helperExits, pid)
	helperMu.Unlock()
	if ch != nil {
		ch <- ws
	}
}

// shotLimit spaces the screenshots of the sandbox (all connections).
var (
	shotLimit = rate.NewLimiter(rate.Limit(MaxScreenshotsPerSecond), 1)
	shotMu    sync.Mutex
)

// toolRun is the outcome of one tool run.
type toolRun struct {
	stdout []byte
	stderr string
	status syscall.WaitStatus
}

func (r *toolRun) ok() bool { return r.status.Exited() && r.status.ExitStatus() == 0 }

// failure describes a failed run for the host.
func (r *toolRun) failure(what string) error {
	msg := strings.TrimSpace(r.stderr)
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	if strings.Contains(msg, "Can't open display") || strings.Contains(msg, "Can't open X display") ||
		strings.Contains(msg, "Failed creating new xdo") {
		return &Error{Code: CodeNoDisplay, Message: fmt.Sprintf("%s: the X display is not running (%s)", what, msg)}
	}
	code := r.status.ExitStatus()
	if r.status.Signaled() {
		code = 128 + int(r.status.Signal())
	}
	return &Error{Code: CodeIO, Message: fmt.Sprintf("%s failed (exit %d): %s", what, code, msg)}
}

// runTool runs argv as the workload with env and stdin, and waits for it
// at most timeout. Its process group is killed when it ends.
func (c *hostConn) runTool(ctx context.Context, env []string, stdin []byte, timeout time.Duration, argv ...string) (*toolRun, error) {
	path, err := lookPath(argv[0], getenv(env, "PATH"), "/")
	if err != nil {
		return nil, &Error{Code: CodeNoDisplay, Message: fmt.Sprintf("%s is not installed in this sandbox's image (computer use needs an image with X tools, e.g. the desktop image): %v", argv[0], err)}
	}
	if len(stdin) > 60<<10 {
		return nil, &Error{Code: CodeTooLarge, Message: "input too large"}
	}
	fds, err := stdioPipes()
	if err != nil {
		return nil, err
	}
	// The input fits the pipe's buffer: write it all before the start.
	if len(stdin) > 0 {
		if _, err := syscall.Write(fds[1], stdin); err != nil {
			for _, fd := range fds {
				syscall.Close(fd)
			}
			return nil, fmt.Errorf("writing input: %w", err)
		}
	}
	syscall.Close(fds[1])
	attr := &syscall.ProcAttr{
		Dir:   "/",
		Env:   env,
		Files: []uintptr{uintptr(fds[0]), uintptr(fds[3]), uintptr(fds[5])},
		Sys:   theWorkload.sysProcAttr(&syscall.SysProcAttr{Setpgid: true, Credential: workloadCred, AmbientCaps: workloadCaps}),
	}
	done := make(chan syscall.WaitStatus, 1)
	c.forkMu.RLock()
	var pid int
	err = theSpawner.run(func() (ferr error) {
		pid, ferr = syscall.ForkExec(path, argv, attr)
		return ferr
	})
	if err == nil {
		helperMu.Lock()
		helperExits[pid] = done
		helperMu.Unlock()
	}
	c.forkMu.RUnlock()
	syscall.Close(fds[0])
	syscall.Close(fds[3])
	syscall.Close(fds[5])
	if err != nil {
		syscall.Close(fds[2])
		syscall.Close(fds[4])
		return nil, startError(path, err)
	}
	deadline := time.Now().Add(timeout)
	// Non-blocking before os.NewFile, so that the files use the poller
	// and honour the deadline.
	syscall.SetNonblock(fds[2], true)
	syscall.SetNonblock(fds[4], true)
	out := os.NewFile(uintptr(fds[2]), "stdout")
	errf := os.NewFile(uintptr(fds[4]), "stderr")
	defer out.Close()
	defer errf.Close()
	out.SetReadDeadline(deadline)
	errf.SetReadDeadline(deadline)
	type read struct {
		b   []byte
		err error
	}
	outc, errc := make(chan read, 1), make(chan read, 1)
	go func() {
		b, err := io.ReadAll(io.LimitReader(out, maxToolOut+1))
		outc <- read{b, err}
	}()
	go func() {
		b, err := io.ReadAll(io.LimitReader(errf, 4<<10))
		errc <- read{b, err}
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var ws syscall.WaitStatus
	var why error
	select {
	case ws = <-done:
	case <-timer.C:
		why = &Error{Code: CodeTimeout, Message: fmt.Sprintf("%s did not finish in %v", argv[0], timeout)}
	case <-ctx.Done():
		why = errStreamGone
	}
	// Whatever it left in its group goes with it.
	syscall.Kill(-pid, syscall.SIGKILL)
	if why != nil {
		ws = <-done
	}
	o, e := <-outc, <-errc
	if why != nil {
		return nil, why
	}
	if len(o.b) > maxToolOut {
		return nil, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("%s wrote more than %d bytes", argv[0], maxToolOut)}
	}
	if o.err != nil && !errors.Is(o.err, os.ErrDeadlineExceeded) {
		return nil, fmt.Errorf("reading %s: %w", argv[0], o.err)
	}
	return &toolRun{stdout: o.b, stderr: string(e.b), status: ws}, nil
}

// xdotool runs xdotool with args and fails unless it succeeded.
func (c *hostConn) xdotool(ctx context.Context, env []string, stdin []byte, args ...string) (*toolRun, error) {
	timeout := toolTimeout
	if len(stdin) > 0 {
		timeout += time.Duration(len(stdin)*typeDelayMs*2) * time.Millisecond
	}
	r, err := c.runTool(ctx, env, stdin, timeout, append([]string{"xdotool"}, args...)...)
	if err != nil {
		return nil, err
	}
	if !r.ok() {
		return nil, r.failure("xdotool " + args[0])
	}
	return r, nil
}

// screen asks the display's size.
func (c *hostConn) screen(ctx context.Context, env []string) (ScreenSize, error) {
	r, err := c.xdotool(ctx, env, nil, "getdisplaygeometry")
	if err != nil {
		return ScreenSize{}, err
	}
	f := strings.Fields(string(r.stdout))
	if len(f) != 2 {
		return ScreenSize{}, &Error{Code: CodeIO, Message: fmt.Sprintf("xdotool getdisplaygeometry printed %q", truncate(r.stdout))}
	}
	w, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || w < 1 || h < 1 || w > MaxScreenSide || h > MaxScreenSide {
		return ScreenSize{}, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("display size %q: each side must be 1..%d", truncate(r.stdout), MaxScreenSide)}
	}
	return ScreenSize{w, h}, nil
}

func truncate(b []byte) string {
	if len(b) > 80 {
		b = b[:80]
	}
	return string(b)
}

// activeWindow reads the focused window's id and title (xdotool
// getactivewindow, getwindowname); the zero Window when none has the focus.
func (c *hostConn) activeWindow(ctx context.Context, env []string) (Window, error) {
	r, err := c.runTool(ctx, env, nil, toolTimeout, "xdotool", "getactivewindow")
	if err != nil {
		return Window{}, err
	}
	if !r.ok() {
		if ferr := r.failure("xdotool getactivewindow"); errors.As(ferr, new(*Error)) && ferr.(*Error).Code == CodeNoDisplay {
			return Window{}, ferr
		}
		return Window{}, nil // no window has the focus
	}
	id := strings.TrimSpace(string(r.stdout))
	if !windowIDRe.MatchString(id) {
		return Window{}, &Error{Code: CodeIO, Message: fmt.Sprintf("xdotool getactivewindow printed %q", truncate(r.stdout))}
	}
	n, err := c.xdotool(ctx, env, nil, "getwindowname", id)
	if err != nil {
		return Window{}, err
	}
	title := strings.TrimSuffix(string(n.stdout), "\n")
	if len(title) > MaxWindowTitle {
		title = strings.ToValidUTF8(title[:MaxWindowTitle], "")
	}
	return Window{ID: id, Title: title}, nil
}

// cursor asks the pointer's position.
func (c *hostConn) cursor(ctx context.Context, env []string) (Point, error) {
	r, err := c.xdotool(ctx, env, nil, "getmouselocation", "--shell")
	if err != nil {
		return Point{}, err
	}
	var p Point
	seen := 0
	for _, l := range strings.Split(string(r.stdout), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			continue
		}
		switch k {
		case "X":
			p.X, seen = n, seen|1
		case "Y":
			p.Y, seen = n, seen|2
		}
	}
	if seen != 3 {
		return Point{}, &Error{Code: CodeIO, Message: fmt.Sprintf("xdotool getmouselocation printed %q", truncate(r.stdout))}
	}
	return p, nil
}

// fit is the size of a screen scaled to fit into box, keeping its aspect
// ratio; never larger than the screen.
func fit(screen ScreenSize, box *ScreenSize) ScreenSize {
	if box == nil || (box.Width >= screen.Width && box.Height >= screen.Height) {
		return screen
	}
	w, h := box.Width, screen.Height*box.Width/screen.Width
	if h > box.Height {
		w, h = screen.Width*box.Height/screen.Height, box.Height
	}
	return ScreenSize{max(w, 1), max(h, 1)}
}

// coordinates between the caller's view (size view) and the screen.
func toScreen(p Point, screen, view ScreenSize) Point {
	x := (p.X*screen.Width + view.Width/2) / view.Width
	y := (p.Y*screen.Height + view.Height/2) / view.Height
	return Point{min(x, screen.Width-1), min(y, screen.Height-1)}
}

func toView(p Point, screen, view ScreenSize) Point {
	return Point{p.X * view.Width / screen.Width, p.Y * view.Height / screen.Height}
}

func itoa(n int) string { return strconv.Itoa(n) }

// handleComputer performs one ComputerAction.
func (c *hostConn) handleComputer(s *astream, payload []byte) (any, error) {
	var a ComputerAction
	if err := decodeJSON(payload, &a); err != nil {
		return nil, invalid(err)
	}
	if err := a.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.onGone(cancel)
	display := a.Display
	if display == "" {
		display = ":0"
	}
	env, err := mergeEnv(c.env, []string{"DISPLAY=" + display})
	if err != nil {
		return nil, err
	}
	if err := s.send(FrameStarted, startedMsg{}); err != nil {
		return nil, err
	}
	screen, err := c.screen(ctx, env)
	if err != nil {
		return nil, err
	}
	view := fit(screen, a.Scale)
	res := ComputerResult{Screen: screen}
	at := func(p *Point) []string {
		if p == nil {
			return nil
		}
		sp := toScreen(*p, screen, view)
		return []string{"mousemove", itoa(sp.X), itoa(sp.Y)}
	}
	if want := a.ExpectWindow; want != nil {
		// Checked last thing before acting: the window an approval was
		// asked for, not whatever took the focus while a human answered.
		w, err := c.activeWindow(ctx, env)
		if err != nil {
			return nil, err
		}
		if w != *want {
			return nil, &Error{Code: CodeWindowChanged, Message: fmt.Sprintf("the focused window is now %s %q, not %s %q: nothing done", w.ID, w.Title, want.ID, want.Title)}
		}
	}
	var shot []byte
	switch a.Action {
	case ActionActiveWindow:
		var w Window
		if w, err = c.activeWindow(ctx, env); err == nil {
			res.Window = &w
		}
	case ActionScreenshot:
		if shot, err = c.screenshot(ctx, env, screen, view); err != nil {
			return nil, err
		}
		res.Image = &view
	case ActionCursorPosition, ActionScreenSize:
	case ActionMouseMove:
		_, err = c.xdotool(ctx, env, nil, at(a.Coordinate)...)
	case ActionLeftClick, ActionRightClick, ActionMiddleClick, ActionDoubleClick, ActionTripleClick:
		button, repeat := "1", "1"
		switch a.Action {
		case ActionRightClick:
			button = "3"
		case ActionMiddleClick:
			button = "2"
		case ActionDoubleClick:
			repeat = "2"
		case ActionTripleClick:
			repeat = "3"
		}
		args := append(at(a.Coordinate), "click", "--repeat", repeat, "--delay", "80", button)
		err = c.withKeys(ctx, env, a.Text, func() error { _, err := c.xdotool(ctx, env, nil, args...); return err })
	case ActionLeftMouseDown, ActionLeftMouseUp:
		verb := "mousedown"
		if a.Action == ActionLeftMouseUp {
			verb = "mouseup"
		}
		_, err = c.xdotool(ctx, env, nil, append(at(a.Coordinate), verb, "1")...)
	case ActionDrag:
		args := append(at(a.StartCoordinate), "mousedown", "1", "sleep", "0.1")
		args = append(append(args, at(a.Coordinate)...), "sleep", "0.1", "mouseup", "1")
		_, err = c.xdotool(ctx, env, nil, args...)
	case ActionScroll:
		n := a.ScrollAmount
		if n == 0 {
			n = 3
		}
		button := map[string]string{"up": "4", "down": "5", "left": "6", "right": "7"}[a.ScrollDirection]
		args := append(at(a.Coordinate), "click", "--repeat", itoa(n), "--delay", "30", button)
		err = c.withKeys(ctx, env, a.Text, func() error { _, err := c.xdotool(ctx, env, nil, args...); return err })
	case ActionType:
		// The text goes through stdin: no argument of xdotool's is ever
		// the caller's text.
		_, err = c.xdotool(ctx, env, []byte(a.Text), "type", "--delay", itoa(typeDelayMs), "--file", "-")
	case ActionKey:
		var keys []string
		if keys, err = KeyArgs(a.Text); err == nil {
			_, err = c.xdotool(ctx, env, nil, append([]string{"key", "--delay", "30", "--"}, keys...)...)
		}
	case ActionHoldKey:
		err = c.withKeys(ctx, env, a.Text, func() error { return sleepCtx(ctx, a.Duration) })
	case ActionWait:
		err = sleepCtx(ctx, a.Duration)
	}
	if err != nil {
		return nil, err
	}
	p, err := c.cursor(ctx, env)
	if err != nil {
		return nil, err
	}
	p = toView(p, screen, view)
	res.Cursor = &p
	total := len(shot)
	for len(shot) > 0 {
		n := min(len(shot), chunkSize)
		if err := s.sendData(FrameData, shot[:n]); err != nil {
			return nil, err
		}
		shot = shot[n:]
	}
	return computerDone{Result: res, Bytes: int64(total)}, nil
}

// withKeys holds the key combinations of text (if any) down while fn
// runs; they are released even when fn fails.
func (c *hostConn) withKeys(ctx context.Context, env []string, text string, fn func() error) error {
	if text == "" {
		return fn()
	}
	keys, err := KeyArgs(text)
	if err != nil {
		return err
	}
	if _, err := c.xdotool(ctx, env, nil, append([]string{"keydown", "--"}, keys...)...); err != nil {
		return err
	}
	ferr := fn()
	// Released on a context of its own: a caller that went away must not
	// leave a key stuck down.
	rctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	_, err = c.xdotool(rctx, env, nil, append([]string{"keyup", "--"}, keys...)...)
	if ferr != nil {
		return ferr
	}
	return err
}

func sleepCtx(ctx context.Context, sec float64) error {
	t := time.NewTimer(time.Duration(sec * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return errStreamGone
	}
}

// screenshot takes the display's picture with scrot (PNG on its stdout),
// checks it is the display's size, and scales it to view.
func (c *hostConn) screenshot(ctx context.Context, env []string, screen, view ScreenSize) ([]byte, error) {
	shotMu.Lock()
	defer shotMu.Unlock()
	if err := shotLimit.Wait(ctx); err != nil {
		return nil, errStreamGone
	}
	r, err := c.runTool(ctx, env, nil, toolTimeout, "scrot", "--overwrite", "--pointer", "-")
	if err != nil {
		return nil, err
	}
	if !r.ok() {
		return nil, r.failure("scrot")
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(r.stdout))
	if err != nil {
		return nil, &Error{Code: CodeIO, Message: fmt.Sprintf("scrot did not write a PNG: %v", err)}
	}
	if cfg.Width != screen.Width || cfg.Height != screen.Height {
		return nil, &Error{Code: CodeIO, Message: fmt.Sprintf("scrot's picture is %dx%d, the display %dx%d", cfg.Width, cfg.Height, screen.Width, screen.Height)}
	}
	if view == screen {
		return r.stdout, nil
	}
	src, err := png.Decode(bytes.NewReader(r.stdout))
	if err != nil {
		return nil, &Error{Code: CodeIO, Message: fmt.Sprintf("decoding scrot's PNG: %v", err)}
	}
	dst := image.NewRGBA(image.Rect(0, 0, view.Width, view.Height))
	draw.ApproxBiLinear.Scale(dst, dst.Bounds(), src, src.Bounds(), draw.Src, nil)
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(&buf, dst); err != nil {
		return nil, fmt.Errorf("encoding the screenshot: %w", err)
	}
	return buf.Bytes(), nil
}
