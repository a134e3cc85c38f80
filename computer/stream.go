package computer

import (
	"context"
	"fmt"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/manager"
)

// Ports of the desktop's live stream inside the sandbox: x11vnc's VNC
// server and noVNC (websockify serving /opt/noVNC), both on the sandbox's
// loopback only, where E2B Desktop's SDK puts them too.
const (
	VNCPort   = 5900
	NoVNCPort = 6080
)

// StreamArgv is what StartStream runs in the sandbox when nothing
// listens on NoVNCPort: x11vnc on the display (shared, so that several
// viewers and the E2B SDK's own can watch), then noVNC. A fixed argv: no
// caller's text is part of it.
var StreamArgv = []string{"/bin/sh", "-c", fmt.Sprintf(
	"x11vnc -display :0 -localhost -rfbport %d -forever -shared -nopw -bg -quiet -o /tmp/x11vnc.log && "+
		"exec websockify --web /opt/noVNC 127.0.0.1:%d 127.0.0.1:%d >/tmp/novnc.log 2>&1", VNCPort, NoVNCPort, VNCPort)}

// StreamTimeout bounds the wait for noVNC to listen.
const StreamTimeout = 60 * time.Second

// StreamRunning reports whether something listens on NoVNCPort in sb.
func StreamRunning(ctx context.Context, sb *manager.Sandbox) bool {
	c, err := sb.Agent().Dial(ctx, NoVNCPort)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// StartStream starts the desktop (as Do) and then its stream
// (StreamArgv) unless noVNC already listens; it returns once noVNC
// answers. audit is called before the stream's processes start, and an
// error from it starts none.
func StartStream(ctx context.Context, sb *manager.Sandbox, audit func(argv []string) error) error {
	if StreamRunning(ctx, sb) {
		return nil
	}
	// The display first: an image without one refuses (no_display)
	// before anything is recorded as started.
	if _, err := Do(ctx, sb, agent.ComputerAction{Action: agent.ActionScreenSize}); err != nil {
		return err
	}
	if err := audit(StreamArgv); err != nil {
		return err
	}
	_, err, _ := starting.Do(sb.ID+"/stream", func() (any, error) {
		if StreamRunning(ctx, sb) {
			return nil, nil
		}
		p, err := sb.Agent().Exec(ctx, agent.ExecRequest{Argv: StreamArgv, Background: true, Tag: "airlock-stream"})
		if err != nil {
			return nil, fmt.Errorf("starting the desktop's stream: %w", err)
		}
		p.Close() // detach: it keeps running
		ctx, cancel := context.WithTimeout(ctx, StreamTimeout)
		defer cancel()
		for !StreamRunning(ctx, sb) {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("noVNC did not listen on port %d in %v (see /tmp/x11vnc.log and /tmp/novnc.log in the sandbox)", NoVNCPort, StreamTimeout)
			case <-time.After(250 * time.Millisecond):
			}
		}
		return nil, nil
	})
	return err
}
