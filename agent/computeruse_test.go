package agent

import (
	"errors"
	"testing"
)

// TestComputerActionValidate: what the agent refuses before it runs a
// tool, and what it lets through.
func TestComputerActionValidate(t *testing.T) {
	p := func(x, y int) *Point { return &Point{x, y} }
	good := []ComputerAction{
		{Action: ActionScreenshot}, {Action: ActionScreenshot, Scale: &ScreenSize{800, 600}},
		{Action: ActionLeftClick}, {Action: ActionLeftClick, Coordinate: p(1, 2), Text: "shift"},
		{Action: ActionKey, Text: "ctrl+s"}, {Action: ActionKey, Text: "Return ctrl+shift+t"}, {Action: ActionKey, Text: "ctrl+;"},
		{Action: ActionType, Text: "$(rm -rf /) -- --help; `x`"}, {Action: ActionDrag, StartCoordinate: p(0, 0), Coordinate: p(5, 5)},
		{Action: ActionScroll, ScrollDirection: "down"}, {Action: ActionWait, Duration: 1.5}, {Action: ActionScreenshot, Display: ":1"},
	}
	for _, a := range good {
		if err := a.Validate(); err != nil {
			t.Errorf("%+v: %v", a, err)
		}
	}
	bad := []ComputerAction{
		{Action: "exec"}, {Action: ""},
		{Action: ActionKey}, {Action: ActionKey, Text: "--version"}, {Action: ActionKey, Text: "a;b"}, {Action: ActionKey, Text: "ctrl+"},
		{Action: ActionKey, Text: "-"}, {Action: ActionLeftClick, Text: "-x"},
		{Action: ActionType}, {Action: ActionType, Text: "a\x00"},
		{Action: ActionMouseMove}, {Action: ActionMouseMove, Coordinate: p(-1, 0)}, {Action: ActionMouseMove, Coordinate: p(0, MaxScreenSide+1)},
		{Action: ActionDrag, Coordinate: p(1, 1)}, {Action: ActionScroll, ScrollDirection: "in"},
		{Action: ActionScroll, ScrollDirection: "up", ScrollAmount: MaxScrollAmount + 1},
		{Action: ActionWait, Duration: MaxWaitSeconds + 1}, {Action: ActionWait, Duration: -1},
		{Action: ActionScreenshot, Scale: &ScreenSize{0, 10}}, {Action: ActionScreenshot, Scale: &ScreenSize{MaxShotSide + 1, 10}},
		{Action: ActionScreenshot, Display: "0"}, {Action: ActionScreenshot, Display: ":0 -e"},
	}
	for _, a := range bad {
		var ae *Error
		if err := a.Validate(); !errors.As(err, &ae) || ae.Code != CodeInvalidArgument {
			t.Errorf("%+v: %v, want invalid_argument", a, err)
		}
	}
	for _, k := range []string{"exec", "sleep", "ctrl+type"} {
		if _, err := KeyArgs(k); err == nil {
			t.Errorf("xdotool command %q passed as a key", k)
		}
	}
}

// TestComputerScale: screenshots fit the caller's box keeping the aspect
// ratio, and coordinates map both ways.
func TestComputerScale(t *testing.T) {
	screen := ScreenSize{1024, 768}
	for _, c := range []struct{ box, want ScreenSize }{
		{ScreenSize{512, 512}, ScreenSize{512, 384}}, {ScreenSize{2000, 2000}, screen},
		{ScreenSize{1024, 384}, ScreenSize{512, 384}}, {ScreenSize{1, 1}, ScreenSize{1, 1}},
	} {
		if got := fit(screen, &c.box); got != c.want {
			t.Errorf("fit %v in %v = %v, want %v", screen, c.box, got, c.want)
		}
	}
	view := ScreenSize{512, 384}
	if p := toScreen(Point{50, 60}, screen, view); p != (Point{100, 120}) {
		t.Errorf("toScreen = %v", p)
	}
	if p := toScreen(Point{512, 384}, screen, view); p != (Point{1023, 767}) {
		t.Errorf("toScreen of the far corner = %v", p)
	}
	if p := toView(Point{100, 120}, screen, view); p != (Point{50, 60}) {
		t.Errorf("toView = %v", p)
	}
}
