package client

import (
	"context"
)

// ComputerAction is one computer-use action (POST .../computer): the
// common computer-use tool schema's fields (docs/computer-use.md).
type ComputerAction struct {
	Action          string  `json:"action"`
	Coordinate      *Point  `json:"coordinate,omitempty"`
	StartCoordinate *Point  `json:"start_coordinate,omitempty"`
	Text            string  `json:"text,omitempty"`
	ScrollDirection string  `json:"scroll_direction,omitempty"`
	ScrollAmount    int     `json:"scroll_amount,omitempty"`
	Duration        float64 `json:"duration,omitempty"`
	// Scale is the caller's view of the screen: screenshots fit it and
	// coordinates are read in it.
	Scale   *Size  `json:"scale,omitempty"`
	Display string `json:"display,omitempty"`
}

// Point is a screen position in pixels.
type Point struct {
	X int `json:"x"`
	Y int `json:"y"`
}

// Size is a width and height in pixels.
type Size struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// ComputerResult is the answer to a ComputerAction.
type ComputerResult struct {
	Action string `json:"action"`
	Screen Size   `json:"screen"`
	Cursor *Point `json:"cursor,omitempty"`
	// Window is the focused window (action active_window): its X id and
	// title; both empty when no window has the focus.
	Window *struct {
		ID    string `json:"id"`
		Title string `json:"title"`
	} `json:"window,omitempty"`
	Image *struct {
		MediaType string `json:"media_type"`
		Width     int    `json:"width"`
		Height    int    `json:"height"`
		Data      []byte `json:"data"` // PNG
	} `json:"image,omitempty"`
}

// Computer performs a computer-use action in a sandbox with a display.
func (c *Client) Computer(ctx context.Context, id string, a ComputerAction) (*ComputerResult, error) {
	var out ComputerResult
	return &out, c.call(ctx, "POST", sbPath(id, "/computer"), nil, a, &out)
}
