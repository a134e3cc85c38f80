package agent

import (
	"context"
	"fmt"
)

// FramePtyResize changes the size of a process's pseudo-terminal; Result
// is empty.
const FramePtyResize FrameType = 0x42

func init() { frameNames[FramePtyResize] = "pty_resize" }

// PtySize is a terminal's size in characters.
type PtySize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// valid reports whether the size can be a terminal's.
func (s PtySize) valid() error {
	if s.Cols == 0 || s.Rows == 0 {
		return &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("bad terminal size %dx%d", s.Cols, s.Rows)}
	}
	return nil
}

type ptyResizeMsg struct {
	Pid  int     `json:"pid"`
	Size PtySize `json:"size"`
}

// ResizePty sets the terminal size of a process started with a Pty; the
// process gets SIGWINCH.
func (c *Client) ResizePty(ctx context.Context, pid int, size PtySize) error {
	if err := size.valid(); err != nil {
		return err
	}
	return c.call(ctx, FramePtyResize, ptyResizeMsg{Pid: pid, Size: size}, nil)
}
