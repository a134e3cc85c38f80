package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/store"
)

// The terminal endpoint, GET /v1/sandboxes/{id}/pty, is a WebSocket that
// runs one command on a pseudo-terminal of the sandbox (the agent's PTY:
// a terminal of the sandbox's own devpts, never one of the host's).
//
// Query: cmd (repeated: the argv; default the sandbox's login shell,
// bash -l or sh -l), cwd, cols and rows (default 80x24), term (the
// command's TERM, default xterm-256color).
//
// Messages: binary frames are terminal bytes, both ways (input to the
// terminal, output from it). Text frames are JSON control messages:
// from the client {"type":"resize","cols":N,"rows":N}; from the server
// first {"type":"started","pid":N}, and at the end
// {"type":"exit","exit_code":N,"signal":"..."} or
// {"type":"error","message":"..."}, after which the server closes the
// connection. Closing the connection kills the command's process group.

// loginShell is the default terminal command: bash if the sandbox has it.
var loginShell = []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"}

// ptyMessage is a JSON control message of the terminal WebSocket.
type ptyMessage struct {
	Type     string `json:"type"`
	Cols     int    `json:"cols,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	Pid      int    `json:"pid,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Message  string `json:"message,omitempty"`
}

// ptySize parses a terminal size; 0 (absent) gives def.
func ptySize(cols, rows int) (agent.PtySize, error) {
	if cols < 1 || rows < 1 || cols > 4096 || rows > 4096 {
		return agent.PtySize{}, errf(http.StatusBadRequest, "bad_request", "bad terminal size %dx%d: cols and rows are 1 to 4096", cols, rows)
	}
	return agent.PtySize{Cols: uint16(cols), Rows: uint16(rows)}, nil
}

// queryInt reads an integer query parameter, def if absent.
func queryInt(r *http.Request, name string, def int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errf(http.StatusBadRequest, "bad_request", "bad %s %q: give a number", name, v)
	}
	return n, nil
}

func (s *Server) pty(w http.ResponseWriter, r *http.Request) error {
	cols, err := queryInt(r, "cols", 80)
	if err != nil {
		return err
	}
	rows, err := queryInt(r, "rows", 24)
	if err != nil {
		return err
	}
	size, err := ptySize(cols, rows)
	if err != nil {
		return err
	}
	term := r.URL.Query().Get("term")
	if term == "" {
		term = "xterm-256color"
	}
	if len(term) > 64 || strings.ContainsAny(term, "=\x00") {
		return errf(http.StatusBadRequest, "bad_request", "bad term %q", truncate(term, 64))
	}
	argv := r.URL.Query()["cmd"]
	if len(argv) == 0 {
		argv = loginShell
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if argv, err = sb.ExecArgv(argv, false); err != nil {
		return err
	}
	k := caller(r)
	// Fail closed: nothing runs unless its audit record is written.
	if err := s.m.AuditFirst(r.Context(), k.id, sb.ID, store.ActionExec, map[string]any{"argv": argv, "pty": true}); err != nil {
		return err
	}
	// browserGuard has already refused any cross-origin request; the
	// library's own Origin check stays on too.
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return nil // Accept has written the HTTP error
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	s.execs.Add(1)
	sendJSON := func(m ptyMessage) error {
		b, _ := json.Marshal(m)
		return conn.Write(ctx, websocket.MessageText, b)
	}
	fail := func(err error) {
		s.m.Audit(context.Background(), k.id, sb.ID, actionExecResult, map[string]any{"argv": argv, "pty": true, "error": err.Error()})
		sendJSON(ptyMessage{Type: "error", Message: err.Error()})
		conn.Close(websocket.StatusInternalError, "terminal failed")
	}
	ag := sb.Agent()
	p, err := ag.Exec(ctx, agent.ExecRequest{Argv: argv, Cwd: r.URL.Query().Get("cwd"), Env: []string{"TERM=" + term}, Pty: &size, Tag: "pty"})
	if err != nil {
		fail(err)
		return nil
	}
	defer p.Close() // kills the command's group if it is still running
	if err := sendJSON(ptyMessage{Type: "started", Pid: p.Pid}); err != nil {
		return nil
	}
	// Input: binary frames to the terminal, text frames are control.
	inErr := make(chan error, 1)
	go func() { inErr <- s.ptyInput(ctx, conn, ag, p) }()
	for {
		select {
		case err := <-inErr:
			// The client went away or broke the protocol: the deferred
			// Close kills the command.
			s.m.Audit(context.Background(), k.id, sb.ID, actionExecResult, map[string]any{"argv": argv, "pty": true, "pid": p.Pid, "detached": err.Error()})
			if websocket.CloseStatus(err) == -1 && ctx.Err() == nil {
				conn.Close(websocket.StatusPolicyViolation, truncate(err.Error(), 120))
			}
			return nil
		case ev, ok := <-p.Events():
			if !ok {
				_, err := p.Wait(ctx)
				if err == nil {
					err = agent.ErrDetached
				}
				fail(fmt.Errorf("following the terminal's process: %w", err))
				return nil
			}
			switch ev.Type {
			case agent.EventStdout, agent.EventStderr:
				if err := conn.Write(ctx, websocket.MessageBinary, ev.Data); err != nil {
					return nil
				}
			case agent.EventExit:
				code := ev.ExitCode
				s.m.Audit(context.Background(), k.id, sb.ID, actionExecResult, map[string]any{"argv": argv, "pty": true, "pid": p.Pid, "exit_code": code, "signal": ev.Signal})
				if sendJSON(ptyMessage{Type: "exit", ExitCode: &code, Signal: ev.Signal}) == nil {
					conn.Close(websocket.StatusNormalClosure, "exited")
				}
				return nil
			}
		}
	}
}

// ptyInput copies the client's frames to the terminal until the
// connection ends or a frame is bad.
func (s *Server) ptyInput(ctx context.Context, conn *websocket.Conn, ag *agent.Client, p *agent.Process) error {
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			return err
		}
		if typ == websocket.MessageBinary {
			if len(b) == 0 {
				continue
			}
			if err := p.WriteStdin(ctx, b, false); err != nil {
				return fmt.Errorf("writing to the terminal: %w", err)
			}
			continue
		}
		var m ptyMessage
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("bad control message: %v", err)
		}
		switch m.Type {
		case "resize":
			size, err := ptySize(m.Cols, m.Rows)
			if err != nil {
				return err
			}
			if err := ag.ResizePty(ctx, p.Pid, size); err != nil {
				return fmt.Errorf("resizing the terminal: %w", err)
			}
		default:
			return fmt.Errorf("unknown control message type %q (want resize)", m.Type)
		}
	}
}

// truncate shortens s to at most n bytes (a WebSocket close reason is
// limited to 123).
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
