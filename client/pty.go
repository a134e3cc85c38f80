package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

// TerminalRequest describes a command to run on a pseudo-terminal.
type TerminalRequest struct {
	// Argv is the command; empty means the sandbox's login shell.
	Argv []string
	// Cwd is the working directory (default /workspace).
	Cwd string
	// Cols and Rows are the initial size; 0 means 80x24.
	Cols, Rows int
	// Term is the command's TERM; "" means xterm-256color.
	Term string
}

// TerminalExit is how a terminal's command ended.
type TerminalExit struct {
	// Code is the exit status (-1 if killed by a signal).
	Code int
	// Signal names the signal that killed it, if one did.
	Signal string
}

// Terminal is a command running on a pseudo-terminal of a sandbox
// (GET /v1/sandboxes/{id}/pty). Read returns the terminal's output, Write
// types into it (Ctrl-C is "\x03"). Read returns io.EOF after the command
// exits; Exit then says how. Close kills the command if it still runs.
type Terminal struct {
	// Pid is the command's pid inside the sandbox.
	Pid  int
	conn *websocket.Conn
	ctx  context.Context
	stop context.CancelFunc

	mu   sync.Mutex
	buf  []byte
	exit *TerminalExit
	err  error
}

type ptyMessage struct {
	Type     string `json:"type"`
	Cols     int    `json:"cols,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	Pid      int    `json:"pid,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Message  string `json:"message,omitempty"`
}

// Terminal starts a command on a pseudo-terminal of sandbox id.
func (c *Client) Terminal(ctx context.Context, id string, req TerminalRequest) (*Terminal, error) {
	q := url.Values{}
	for _, a := range req.Argv {
		q.Add("cmd", a)
	}
	if req.Cwd != "" {
		q.Set("cwd", req.Cwd)
	}
	if req.Term != "" {
		q.Set("term", req.Term)
	}
	if req.Cols != 0 {
		q.Set("cols", strconv.Itoa(req.Cols))
	}
	if req.Rows != 0 {
		q.Set("rows", strconv.Itoa(req.Rows))
	}
	u := c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/pty"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.HTTP, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, errorOf(resp)
		}
		return nil, fmt.Errorf("airlock: terminal: %w", err)
	}
	conn.SetReadLimit(1 << 20)
	typ, b, err := conn.Read(ctx)
	if err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("airlock: terminal: %w", err)
	}
	var m ptyMessage
	if typ != websocket.MessageText || json.Unmarshal(b, &m) != nil || (m.Type != "started" && m.Type != "error") {
		conn.CloseNow()
		return nil, fmt.Errorf("airlock: terminal: unexpected first message %q", truncateBytes(b, 200))
	}
	if m.Type == "error" {
		conn.CloseNow()
		return nil, fmt.Errorf("airlock: terminal: %s", m.Message)
	}
	tctx, stop := context.WithCancel(context.Background())
	return &Terminal{Pid: m.Pid, conn: conn, ctx: tctx, stop: stop}, nil
}

func truncateBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	return string(b)
}

// Read reads the terminal's output.
func (t *Terminal) Read(p []byte) (int, error) {
	for {
		t.mu.Lock()
		if len(t.buf) > 0 {
			n := copy(p, t.buf)
			t.buf = t.buf[n:]
			t.mu.Unlock()
			return n, nil
		}
		if t.err != nil {
			err := t.err
			t.mu.Unlock()
			return 0, err
		}
		t.mu.Unlock()
		typ, b, err := t.conn.Read(t.ctx)
		t.mu.Lock()
		switch {
		case err != nil:
			if t.exit != nil {
				t.err = io.EOF
			} else {
				t.err = fmt.Errorf("airlock: terminal: %w", err)
			}
		case typ == websocket.MessageBinary:
			t.buf = append(t.buf, b...)
		default:
			var m ptyMessage
			if json.Unmarshal(b, &m) != nil {
				t.err = fmt.Errorf("airlock: terminal: bad control message %q", truncateBytes(b, 200))
				break
			}
			switch m.Type {
			case "exit":
				e := TerminalExit{Code: -1, Signal: m.Signal}
				if m.ExitCode != nil {
					e.Code = *m.ExitCode
				}
				t.exit = &e
				t.err = io.EOF
			case "error":
				t.err = errors.New("airlock: terminal: " + m.Message)
			}
		}
		t.mu.Unlock()
	}
}

// Write types p into the terminal.
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.conn.Write(t.ctx, websocket.MessageBinary, p); err != nil {
		return 0, fmt.Errorf("airlock: terminal: %w", err)
	}
	return len(p), nil
}

// Resize sets the terminal's size; the command gets SIGWINCH.
func (t *Terminal) Resize(cols, rows int) error {
	b, _ := json.Marshal(ptyMessage{Type: "resize", Cols: cols, Rows: rows})
	if err := t.conn.Write(t.ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("airlock: terminal resize: %w", err)
	}
	return nil
}

// Exit returns how the command ended, once Read has returned io.EOF;
// nil before.
func (t *Terminal) Exit() *TerminalExit {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.exit
}

// Close ends the terminal; a command still running is killed.
func (t *Terminal) Close() error {
	t.conn.Close(websocket.StatusNormalClosure, "")
	t.stop()
	return nil
}
