package e2b

import (
	"context"

	"github.com/airlock-dev/airlock/agent"
)

// Pseudo-terminals (envd's pty option of process.Start, and Update to
// resize): the agent runs the process on a terminal of the sandbox's own
// devpts; its output is sent as pty data, its input written as stdin.

// defaultPty is the size of a terminal whose size is not given.
var defaultPty = agent.PtySize{Cols: 80, Rows: 24}

// ptyOf converts a Start request's pty option; nil means no terminal.
func ptyOf(c *ptyConfig) (*agent.PtySize, *Error) {
	if c == nil {
		return nil, nil
	}
	size := defaultPty
	if c.Size != nil {
		if c.Size.Cols == 0 || c.Size.Rows == 0 || c.Size.Cols > 4096 || c.Size.Rows > 4096 {
			return nil, errorf(CodeInvalidArgument, "bad terminal size %dx%d", c.Size.Cols, c.Size.Rows)
		}
		size = agent.PtySize{Cols: uint16(c.Size.Cols), Rows: uint16(c.Size.Rows)}
	}
	return &size, nil
}

// processUpdate serves process.Process/Update: a terminal's new size.
func (h *Handler) processUpdate(ctx context.Context, b *boxState, body []byte) (any, error) {
	var req updateRequest
	if err := decodeMessage(body, &req); err != nil {
		return nil, err
	}
	if req.Pty == nil || req.Pty.Size == nil {
		return nil, errorf(CodeInvalidArgument, "pty.size is required")
	}
	size, cerr := ptyOf(req.Pty)
	if cerr != nil {
		return nil, cerr
	}
	_, pid, err := h.resolvePid(ctx, b, req.Process)
	if err != nil {
		return nil, err
	}
	if err := b.sb.Agent().ResizePty(ctx, pid, *size); err != nil {
		return nil, agentRPCError(err)
	}
	return &empty{}, nil
}
