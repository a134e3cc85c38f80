package server

import (
	"errors"
	"net/http"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/computer"
)

// ComputerImage is a screenshot in a ComputerResponse.
type ComputerImage struct {
	// MediaType is image/png.
	MediaType string `json:"media_type"`
	// Width and Height are the picture's size in pixels.
	Width  int `json:"width"`
	Height int `json:"height"`
	// Data is the PNG, base64 (JSON's encoding of bytes).
	Data []byte `json:"data"`
}

// ComputerResponse is the body of POST .../computer.
type ComputerResponse struct {
	// Action is the action done.
	Action string `json:"action"`
	// Screen is the display's size in its own pixels.
	Screen agent.ScreenSize `json:"screen"`
	// Cursor is the pointer's position after the action, in the
	// request's scale.
	Cursor *agent.Point `json:"cursor,omitempty"`
	// Window is the focused window (action active_window).
	Window *agent.Window `json:"window,omitempty"`
	// Image is the screenshot (action screenshot).
	Image *ComputerImage `json:"image,omitempty"`
}

// computer performs one computer-use action (docs/computer-use.md).
func (s *Server) computer(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	var a agent.ComputerAction
	if err := decode(w, r, &a); err != nil {
		return errf(400, "bad_request", "%v", err)
	}
	if err := a.Validate(); err != nil {
		return computerErr(err)
	}
	// Held for approval first, like a command (docs/approvals.md).
	if err := s.approve(r, computer.ApprovalAction(sb, &a)); err != nil {
		return err
	}
	// Fail closed like exec: no action without its audit record.
	if err := s.m.AuditFirst(r.Context(), caller(r).id, sb.ID, computer.Action(a), computer.Detail("api", a)); err != nil {
		return err
	}
	res, err := computer.Do(r.Context(), sb, a)
	if err != nil {
		return computerErr(err)
	}
	out := ComputerResponse{Action: a.Action, Screen: res.Screen, Cursor: res.Cursor, Window: res.Window}
	if res.Image != nil {
		out.Image = &ComputerImage{MediaType: "image/png", Width: res.Image.Width, Height: res.Image.Height, Data: res.PNG}
	}
	writeJSON(w, 200, out)
	return nil
}

// computerErr maps the agent's computer-use errors: no display is a
// conflict with the sandbox's state, not a server fault.
func computerErr(err error) error {
	var ae *agent.Error
	if errors.As(err, &ae) && ae.Code == agent.CodeNoDisplay {
		return errf(409, "no_display", "%s", ae.Message)
	}
	if errors.As(err, &ae) && ae.Code == agent.CodeInvalidArgument {
		return errf(400, "bad_request", "%s", ae.Message)
	}
	if errors.As(err, &ae) && ae.Code == agent.CodeWindowChanged {
		return errf(409, "window_changed", "%s", ae.Message)
	}
	if errors.As(err, &ae) && ae.Code == agent.CodeIO {
		return errf(502, "computer_failed", "%s", ae.Message)
	}
	return err
}
