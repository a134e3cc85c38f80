package mcp

import (
	"context"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/computer"
)

// computerIn is the input of the computer tool: the common computer-use
// tool schema's actions and fields, coordinates as [x, y].
type computerIn struct {
	Action          string  `json:"action" jsonschema:"What to do: screenshot, cursor_position, screen_size, mouse_move, left_click, right_click, middle_click, double_click, triple_click, left_mouse_down, left_mouse_up, left_click_drag, scroll, type, key, hold_key, wait or active_window (the focused window's title)."`
	Coordinate      []int   `json:"coordinate,omitempty" jsonschema:"[x, y] in the screenshot's pixels: where to move, click or scroll (clicks and scroll without it act at the pointer), or where left_click_drag ends."`
	StartCoordinate []int   `json:"start_coordinate,omitempty" jsonschema:"[x, y] where left_click_drag starts."`
	Text            string  `json:"text,omitempty" jsonschema:"type: the text to type. key and hold_key: key combinations in xdotool names (ctrl+s, Return, alt+Tab; several separated by spaces). Clicks and scroll: modifier keys to hold meanwhile (shift)."`
	ScrollDirection string  `json:"scroll_direction,omitempty" jsonschema:"scroll: up, down, left or right."`
	ScrollAmount    int     `json:"scroll_amount,omitempty" jsonschema:"scroll: wheel clicks (default 3)."`
	Duration        float64 `json:"duration,omitempty" jsonschema:"wait and hold_key: seconds."`
	Width           int     `json:"width,omitempty" jsonschema:"Scale screenshots to fit this width (and height), and read coordinates in that scaled picture; default the screen's own size."`
	Height          int     `json:"height,omitempty" jsonschema:"See width."`
	SandboxID       string  `json:"sandbox_id,omitempty" jsonschema:"Sandbox to act on: one made by create_sandbox with template desktop (its desktop starts on first use). Omit it to use this session's own sandbox, which has a display only if the server's default root does."`
}

func (s *Service) addComputer() {
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:  "computer",
		Title: "Use the sandbox's desktop (screen, mouse, keyboard)",
		Description: "See and drive the graphical desktop of a sandbox: take a screenshot (a PNG image), move and click the mouse, drag, scroll, type text and press keys. " +
			"Use a sandbox created with create_sandbox template \"desktop\" (Xvfb, XFCE, Chromium, xterm; its desktop starts on the first call). " +
			"Coordinates are pixels of the last screenshot (give the same width/height on every call if you scale). " +
			fmt.Sprintf("Screenshots are the screen's size unless width/height (at most %d each) ask for smaller, and at most %d per second; type takes at most %d bytes. ", agent.MaxShotSide, agent.MaxScreenshotsPerSecond, agent.MaxTypeText) +
			"Every action except screenshot answers with the pointer's position; take a screenshot to see its effect.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(s.openWorld())},
		InputSchema: schema[computerIn](func(p map[string]*jsonschema.Schema) {
			actions := make([]any, len(agent.ComputerActions))
			for i, a := range agent.ComputerActions {
				actions[i] = a
			}
			p["action"].Enum = actions
			p["scroll_direction"].Enum = []any{"up", "down", "left", "right"}
			for _, c := range []string{"coordinate", "start_coordinate"} {
				p[c].MinItems, p[c].MaxItems = ptr(2), ptr(2)
			}
			p["duration"].Minimum, p["duration"].Maximum = ptr(0.0), ptr(float64(agent.MaxWaitSeconds))
			p["scroll_amount"].Minimum, p["scroll_amount"].Maximum = ptr(0.0), ptr(float64(agent.MaxScrollAmount))
			for _, c := range []string{"width", "height"} {
				p[c].Minimum, p[c].Maximum = ptr(0.0), ptr(float64(agent.MaxShotSide))
			}
		}),
	}, s.computer)
}

func point(xy []int, what string) (*agent.Point, error) {
	if xy == nil {
		return nil, nil
	}
	if len(xy) != 2 {
		return nil, userErr("%s must be [x, y]", what)
	}
	return &agent.Point{X: xy[0], Y: xy[1]}, nil
}

func (s *Service) computer(ctx context.Context, req *sdk.CallToolRequest, in computerIn) (*sdk.CallToolResult, any, error) {
	a := agent.ComputerAction{Action: in.Action, Text: in.Text, ScrollDirection: in.ScrollDirection,
		ScrollAmount: in.ScrollAmount, Duration: in.Duration}
	var err error
	if a.Coordinate, err = point(in.Coordinate, "coordinate"); err != nil {
		return toolError(err, ""), nil, nil
	}
	if a.StartCoordinate, err = point(in.StartCoordinate, "start_coordinate"); err != nil {
		return toolError(err, ""), nil, nil
	}
	if in.Width != 0 || in.Height != 0 {
		a.Scale = &agent.ScreenSize{Width: in.Width, Height: in.Height}
	}
	if err := a.Validate(); err != nil {
		return toolError(err, ""), nil, nil
	}
	sb, note, err := s.sandbox(ctx, req, in.SandboxID)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	if s.cfg.Approvals != nil {
		// Held like run_command (docs/approvals.md).
		act := computer.ApprovalAction(sb, &a)
		act.Via, act.Owner = "mcp", callerOf(req).Owner
		if err := s.cfg.Approvals.Check(ctx, act, elicitor(req.Session)); err != nil {
			return toolError(err, note), nil, nil
		}
	}
	if err := s.auditFirst(ctx, sb, computer.Action(a), computer.Detail("mcp", a)); err != nil {
		return toolError(err, note), nil, nil
	}
	res, err := computer.Do(ctx, sb, a)
	if err != nil {
		return toolError(err, note), nil, nil
	}
	r := &sdk.CallToolResult{}
	if res.Image != nil {
		r.Content = append(r.Content, &sdk.ImageContent{Data: res.PNG, MIMEType: "image/png"})
		r.Content = append(r.Content, &sdk.TextContent{Text: fmt.Sprintf("screenshot %dx%d (screen %dx%d)", res.Image.Width, res.Image.Height, res.Screen.Width, res.Screen.Height)})
	} else {
		text := fmt.Sprintf("%s done; screen %dx%d", a.Action, res.Screen.Width, res.Screen.Height)
		if res.Cursor != nil {
			text += fmt.Sprintf("; pointer at [%d, %d]", res.Cursor.X, res.Cursor.Y)
		}
		if res.Window != nil {
			text += fmt.Sprintf("; focused window %q (id %s)", res.Window.Title, res.Window.ID)
		}
		r.Content = append(r.Content, &sdk.TextContent{Text: text})
	}
	return withNote(r, note), nil, nil
}
