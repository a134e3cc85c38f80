package agent

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strings"
)

// FrameComputer performs one computer-use action on the sandbox's X
// display (computeruse_linux.go): the agent answers Started, then, for a
// screenshot, the PNG as Data frames, then a Result with the
// ComputerResult and the PNG's byte count.
const FrameComputer FrameType = 0x43

func init() { frameNames[FrameComputer] = "computer" }

// Computer-use actions: the semantics of the common computer-use tool
// schema (Anthropic's computer tool).
const (
	ActionScreenshot     = "screenshot"
	ActionCursorPosition = "cursor_position"
	ActionMouseMove      = "mouse_move"
	ActionLeftClick      = "left_click"
	ActionRightClick     = "right_click"
	ActionMiddleClick    = "middle_click"
	ActionDoubleClick    = "double_click"
	ActionTripleClick    = "triple_click"
	ActionLeftMouseDown  = "left_mouse_down"
	ActionLeftMouseUp    = "left_mouse_up"
	ActionDrag           = "left_click_drag"
	ActionScroll         = "scroll"
	ActionType           = "type"
	ActionKey            = "key"
	ActionHoldKey        = "hold_key"
	ActionWait           = "wait"
	ActionScreenSize     = "screen_size"
	// ActionActiveWindow answers the focused window's X id and title
	// (what the approval policy matches keyboard actions against).
	ActionActiveWindow = "active_window"
)

// ComputerActions lists every action FrameComputer accepts.
var ComputerActions = []string{ActionScreenshot, ActionCursorPosition, ActionMouseMove, ActionLeftClick,
	ActionRightClick, ActionMiddleClick, ActionDoubleClick, ActionTripleClick, ActionLeftMouseDown,
	ActionLeftMouseUp, ActionDrag, ActionScroll, ActionType, ActionKey, ActionHoldKey, ActionWait, ActionScreenSize,
	ActionActiveWindow}

// Computer-use caps. A screenshot is decoded and scaled inside the
// sandbox (the host never decodes an image the sandbox made) and costs
// the sandbox's own memory and CPU; these bound one action.
const (
	// MaxScreenSide bounds either side of the screen a screenshot reads
	// (a larger display is refused, not decoded).
	MaxScreenSide = 4096
	// MaxShotSide bounds either side of a returned screenshot.
	MaxShotSide = 2048
	// MaxShotBytes bounds a returned PNG.
	MaxShotBytes = 16 << 20
	// MaxScreenshotsPerSecond is the rate at which one sandbox takes
	// screenshots; faster requests wait their turn.
	MaxScreenshotsPerSecond = 10
	// MaxTypeText bounds the text of one type action (bytes).
	MaxTypeText = 4096
	// MaxWaitSeconds bounds the duration of wait and hold_key.
	MaxWaitSeconds = 10
	// MaxScrollAmount bounds the wheel clicks of one scroll.
	MaxScrollAmount = 50
)

// CodeNoDisplay is the error code of an action on a sandbox whose X
// display is not running (or has no xdotool/scrot).
const CodeNoDisplay = "no_display"

// CodeWindowChanged is the error code of an action whose ExpectWindow is
// no longer the focused window: nothing was done.
const CodeWindowChanged = "window_changed"

// Window is an X window: its id (decimal, as xdotool prints it) and title.
// The zero Window is "no window has the focus".
type Window struct {
	ID    string `json:"id"`
	Title string `json:"title"`
}

// Point is a position on the screen, in pixels from the top left.
type Point struct {
	X int `json:"x"`
	Y int `json:"y"`
}

// ScreenSize is a width and height in pixels.
type ScreenSize struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// ComputerAction is one computer-use request.
type ComputerAction struct {
	// Action is one of ComputerActions.
	Action string `json:"action"`
	// Coordinate is where mouse actions act (and, for left_click_drag,
	// where the drag ends); for clicks and scroll it is optional (the
	// current position).
	Coordinate *Point `json:"coordinate,omitempty"`
	// StartCoordinate is where left_click_drag starts.
	StartCoordinate *Point `json:"start_coordinate,omitempty"`
	// Text is what type types, or the key combination(s) key and hold_key
	// press (xdotool key names, e.g. "ctrl+s" or "Return"; several
	// separated by spaces), or, for a click, modifier keys held meanwhile
	// ("shift").
	Text string `json:"text,omitempty"`
	// ScrollDirection is up, down, left or right.
	ScrollDirection string `json:"scroll_direction,omitempty"`
	// ScrollAmount is the wheel clicks of a scroll (default 3).
	ScrollAmount int `json:"scroll_amount,omitempty"`
	// Duration is the seconds of wait and hold_key.
	Duration float64 `json:"duration,omitempty"`
	// Scale, if set, is the caller's view of the screen: screenshots are
	// scaled to fit it (keeping the aspect ratio) and coordinates (given
	// and returned) are in the screenshot's pixels.
	Scale *ScreenSize `json:"scale,omitempty"`
	// Display is the X display (default ":0").
	Display string `json:"display,omitempty"`
	// ExpectWindow, if set, must still be the focused window (same id and
	// title) when the action is about to act, or nothing is done
	// (CodeWindowChanged): an action approved for one window never acts
	// on another.
	ExpectWindow *Window `json:"expect_window,omitempty"`
}

// ComputerResult is the answer to a ComputerAction.
type ComputerResult struct {
	// Screen is the display's size in its own pixels.
	Screen ScreenSize `json:"screen"`
	// Cursor is the pointer's position after the action (scaled like
	// coordinates).
	Cursor *Point `json:"cursor,omitempty"`
	// Window is the focused window (active_window only).
	Window *Window `json:"window,omitempty"`
	// Image is the screenshot's size (a screenshot only).
	Image *ScreenSize `json:"image,omitempty"`
	// PNG is the screenshot (a screenshot only; not part of the JSON
	// control frames, it travels as Data).
	PNG []byte `json:"-"`
}

var displayRe = regexp.MustCompile(`^:[0-9]{1,3}(\.[0-9]{1,2})?$`)

// windowIDRe is an X window id as xdotool prints it.
var windowIDRe = regexp.MustCompile(`^[0-9]{1,10}$`)

// MaxWindowTitle bounds the window title active_window answers (bytes;
// a longer one is cut).
const MaxWindowTitle = 1024

// keyTokenRe is one xdotool key combination: key names joined by '+'.
// Letters, digits and the names of keysyms only: no option-like or empty
// tokens.
var keyTokenRe = regexp.MustCompile(`^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$|^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*\+[^A-Za-z0-9_\s]$|^[^A-Za-z0-9_\s-]$`)

// Validate checks a in full before anything runs.
func (a *ComputerAction) Validate() error {
	bad := func(f string, args ...any) error {
		return &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf(f, args...)}
	}
	known := false
	for _, k := range ComputerActions {
		known = known || a.Action == k
	}
	if !known {
		return bad("unknown action %q (one of %s)", a.Action, strings.Join(ComputerActions, ", "))
	}
	if a.Display != "" && !displayRe.MatchString(a.Display) {
		return bad("display %q is not of the form :N", a.Display)
	}
	if a.Scale != nil && (a.Scale.Width < 1 || a.Scale.Height < 1 || a.Scale.Width > MaxShotSide || a.Scale.Height > MaxShotSide) {
		return bad("scale %dx%d: each side must be 1..%d", a.Scale.Width, a.Scale.Height, MaxShotSide)
	}
	for _, p := range []*Point{a.Coordinate, a.StartCoordinate} {
		if p != nil && (p.X < 0 || p.Y < 0 || p.X > MaxScreenSide || p.Y > MaxScreenSide) {
			return bad("coordinate (%d, %d) is off any screen", p.X, p.Y)
		}
	}
	if a.Duration < 0 || a.Duration > MaxWaitSeconds || math.IsNaN(a.Duration) {
		return bad("duration %g: must be 0..%d seconds", a.Duration, MaxWaitSeconds)
	}
	if strings.IndexByte(a.Text, 0) >= 0 {
		return bad("text contains a NUL byte")
	}
	if w := a.ExpectWindow; w != nil && (!windowIDRe.MatchString(w.ID) && w.ID != "" || len(w.Title) > MaxWindowTitle) {
		return bad("expect_window: id must be decimal digits and the title at most %d bytes", MaxWindowTitle)
	}
	switch a.Action {
	case ActionMouseMove:
		if a.Coordinate == nil {
			return bad("%s needs coordinate", a.Action)
		}
	case ActionDrag:
		if a.Coordinate == nil || a.StartCoordinate == nil {
			return bad("left_click_drag needs start_coordinate and coordinate")
		}
	case ActionScroll:
		switch a.ScrollDirection {
		case "up", "down", "left", "right":
		default:
			return bad("scroll_direction %q: up, down, left or right", a.ScrollDirection)
		}
		if a.ScrollAmount < 0 || a.ScrollAmount > MaxScrollAmount {
			return bad("scroll_amount %d: 0..%d", a.ScrollAmount, MaxScrollAmount)
		}
	case ActionType:
		if a.Text == "" || len(a.Text) > MaxTypeText {
			return bad("type needs text of 1..%d bytes", MaxTypeText)
		}
	case ActionKey, ActionHoldKey:
		if _, err := KeyArgs(a.Text); err != nil {
			return err
		}
	}
	if a.Text != "" && isClick(a.Action) {
		if _, err := KeyArgs(a.Text); err != nil {
			return err
		}
	}
	return nil
}

func isClick(action string) bool {
	switch action {
	case ActionLeftClick, ActionRightClick, ActionMiddleClick, ActionDoubleClick, ActionTripleClick:
		return true
	}
	return false
}

// KeyArgs splits a key text ("ctrl+s Return") into xdotool key
// combinations, refusing anything that is not a key name.
func KeyArgs(text string) ([]string, error) {
	toks := strings.Fields(text)
	if len(toks) == 0 || len(toks) > 32 || len(text) > 512 {
		return nil, &Error{Code: CodeInvalidArgument, Message: "key needs text: 1 to 32 key combinations such as \"ctrl+s\" or \"Return\""}
	}
	for _, t := range toks {
		if !keyTokenRe.MatchString(t) {
			return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("%q is not a key combination (key names joined by '+', e.g. ctrl+shift+t)", t)}
		}
		for _, part := range strings.Split(t, "+") {
			if xdotoolCommands[part] {
				return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("%q is not a key name", part)}
			}
		}
	}
	return toks, nil
}

// Computer performs one computer-use action in the sandbox. A screenshot's
// PNG (at most MaxShotBytes) is in the result's PNG.
func (c *Client) Computer(ctx context.Context, a ComputerAction) (*ComputerResult, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	s, err := c.openStarted(ctx, FrameComputer, a, "computer")
	if err != nil {
		return nil, err
	}
	var png []byte
	for {
		f, err := s.next(ctx)
		if err != nil {
			s.reset()
			return nil, fmt.Errorf("agent computer: %w", err)
		}
		if f.Type == FrameData {
			if len(png)+len(f.Payload) > MaxShotBytes {
				s.reset()
				return nil, protoErr("screenshot larger than %d bytes", MaxShotBytes)
			}
			png = append(png, f.Payload...)
			s.consumed(len(f.Payload))
			continue
		}
		var res computerDone
		if err := finalReply(f, &res); err != nil {
			s.reset()
			return nil, err
		}
		if res.Bytes != int64(len(png)) {
			return nil, protoErr("computer sent %d bytes but reported %d", len(png), res.Bytes)
		}
		if len(png) > 0 {
			res.Result.PNG = png
		}
		return &res.Result, nil
	}
}

// computerDone is the final Result of FrameComputer.
type computerDone struct {
	Result ComputerResult `json:"result"`
	Bytes  int64          `json:"bytes"`
}

// xdotoolCommands are xdotool's command names: a key name equal to one
// would start a chained command, so key texts may not contain them.
var xdotoolCommands = map[string]bool{}

func init() {
	for _, c := range strings.Fields(`getactivewindow getwindowfocus getwindowname getwindowpid getwindowclassname
		getwindowgeometry getdisplaygeometry search selectwindow help version behave behave_screen_edge click
		getmouselocation key keydown keyup mousedown mousemove mousemove_relative mouseup set_window type
		windowactivate windowfocus windowkill windowclose windowquit windowmap windowminimize windowmove
		windowraise windowreparent windowsize windowunmap windowstate set_num_desktops get_num_desktops
		set_desktop get_desktop set_desktop_for_window get_desktop_for_window get_desktop_viewport
		set_desktop_viewport exec sleep`) {
		xdotoolCommands[c] = true
	}
}
