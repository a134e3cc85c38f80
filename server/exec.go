package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/store"
)

// Exec limits.
const (
	// DefaultExecTimeout bounds a foreground exec without a timeout.
	DefaultExecTimeout = 60 * time.Second
	// DefaultMaxOutput caps each of stdout and stderr in a JSON result.
	DefaultMaxOutput = 1 << 20
	// MaxMaxOutput is the largest max_output a client may ask for.
	MaxMaxOutput = 16 << 20
)

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
type ExecRequest struct {
	// Argv is the program and its arguments; exactly one of Argv and Shell.
	Argv []string `json:"argv,omitempty"`
	// Shell is a command line for /bin/sh -c.
	Shell string `json:"shell,omitempty"`
	// Cwd is the working directory (default /workspace).
	Cwd string `json:"cwd,omitempty"`
	// Env is added to the sandbox's environment for this process.
	Env map[string]string `json:"env,omitempty"`
	// Stdin is written to the process's standard input.
	Stdin string `json:"stdin,omitempty"`
	// StdinOpen keeps stdin open for later writes (background processes).
	StdinOpen bool `json:"stdin_open,omitempty"`
	// Tag labels the process in listings.
	Tag string `json:"tag,omitempty"`
	// Background returns {pid} at once; the process outlives the request.
	Background bool `json:"background,omitempty"`
	// Timeout in seconds kills a foreground process (and its group) after
	// this long; default 60.
	Timeout float64 `json:"timeout,omitempty"`
	// MaxOutput caps each of stdout and stderr in the JSON result.
	MaxOutput int `json:"max_output,omitempty"`
}

// ExecResult is the JSON result of a foreground exec.
type ExecResult struct {
	Pid        int     `json:"pid"`
	ExitCode   int     `json:"exit_code"`
	Signal     string  `json:"signal,omitempty"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	Truncated  bool    `json:"truncated"`
	Status     string  `json:"status"`
	DurationMS float64 `json:"duration_ms"`
}

func (req *ExecRequest) toAgent() (agent.ExecRequest, error) {
	if (len(req.Argv) == 0) == (req.Shell == "") {
		return agent.ExecRequest{}, errf(400, "bad_request", "exactly one of argv and shell is required")
	}
	if req.MaxOutput < 0 || req.MaxOutput > MaxMaxOutput {
		return agent.ExecRequest{}, errf(400, "bad_request", "max_output must be between 0 and %d", MaxMaxOutput)
	}
	keys := make([]string, 0, len(req.Env))
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return agent.ExecRequest{}, errf(400, "bad_request", "bad environment variable name %q", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+req.Env[k])
	}
	return agent.ExecRequest{Argv: req.Argv, Shell: req.Shell, Cwd: req.Cwd, Env: env, Stdin: []byte(req.Stdin),
		StdinOpen: req.StdinOpen, Tag: req.Tag, Background: req.Background}, nil
}

func argvOf(req *ExecRequest) []string {
	if req.Shell != "" {
		return []string{"/bin/sh", "-c", req.Shell}
	}
	return req.Argv
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	var req ExecRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	areq, err := req.toAgent()
	if err != nil {
		return err
	}
	timeout, err := seconds(req.Timeout)
	if err != nil {
		return err
	}
	if timeout == 0 {
		timeout = DefaultExecTimeout
	}
	maxOut := req.MaxOutput
	if maxOut == 0 {
		maxOut = DefaultMaxOutput
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if areq.Argv, err = sb.ExecArgv(areq.Argv, areq.Shell != ""); err != nil {
		return err
	}
	k := caller(r)
	// Fail closed: nothing runs unless its audit record is written.
	if err := s.m.AuditFirst(r.Context(), k.id, sb.ID, store.ActionExec, map[string]any{"argv": argvOf(&req), "background": req.Background}); err != nil {
		return err
	}
	// The out-of-memory kill count before the command starts: a kill that
	// comes after is this exec's (read before the start, not after: a
	// command killed at once would otherwise be in the baseline).
	var oom0 int64 = -1
	if !req.Background {
		oom0 = sb.OOMKills()
	}
	start := time.Now()
	s.execs.Add(1)
	p, err := sb.Agent().Exec(r.Context(), areq)
	if err != nil {
		s.m.Audit(r.Context(), k.id, sb.ID, actionExecResult, map[string]any{"argv": argvOf(&req), "error": err.Error()})
		var ae *agent.Error
		if errors.As(err, &ae) && (ae.Code == agent.CodeNotFound || ae.Code == agent.CodePermissionDenied) {
			// Like a shell: 127 not found, 126 not executable.
			res := ExecResult{ExitCode: 127, Status: "not_found", Stderr: ae.Message + "\n"}
			if ae.Code == agent.CodePermissionDenied {
				res.ExitCode, res.Status = 126, "not_executable"
			}
			writeJSON(w, 200, res)
			return nil
		}
		return err
	}
	if req.Background {
		p.Close() // detach: the process keeps running
		s.m.Audit(r.Context(), k.id, sb.ID, actionExecResult, map[string]any{"argv": argvOf(&req), "pid": p.Pid, "background": true})
		writeJSON(w, 201, map[string]int{"pid": p.Pid})
		return nil
	}
	defer p.Close() // kills a foreground process still running (client gone)
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	var res ExecResult
	if wantsSSE(r) {
		res = s.streamProcess(ctx, w, p, start, func() bool { return sb.OOMedSince(oom0) })
	} else {
		out, errOut, trunc, st, err := p.Collect(ctx, maxOut)
		res = ExecResult{Pid: p.Pid, Stdout: string(out), Stderr: string(errOut), Truncated: trunc,
			ExitCode: st.Code, Signal: st.Signal}
		res.Status = status(st, err, r.Context())
		res.DurationMS = ms(time.Since(start))
		if res.Status == "timeout" || res.Status == "error" {
			res.ExitCode = -1
		}
		if res.Signal == "SIGKILL" && sb.OOMedSince(oom0) {
			res.Status = "oom"
		}
		writeJSON(w, 200, res)
	}
	s.m.Audit(r.Context(), k.id, sb.ID, actionExecResult, map[string]any{"argv": argvOf(&req), "pid": p.Pid,
		"exit_code": res.ExitCode, "signal": res.Signal, "status": res.Status, "duration_ms": res.DurationMS})
	return nil
}

// actionExecResult is the audit action of an exec's outcome; the exec
// itself is recorded (store.ActionExec) before it starts.
const actionExecResult = "exec.result"

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func status(st agent.ExitStatus, err error, reqCtx context.Context) string {
	switch {
	case err != nil && errors.Is(err, context.DeadlineExceeded) && reqCtx.Err() == nil:
		return "timeout"
	case err != nil:
		return "error"
	case st.Signal != "":
		return "killed"
	case st.Code != 0:
		return "nonzero_exit"
	}
	return "ok"
}

func wantsSSE(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// sseWriter writes Server-Sent Events.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	id int
}

func newSSE(w http.ResponseWriter) *sseWriter {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(200)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

func (e *sseWriter) send(event string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", event, err)
	}
	e.id++
	if _, err := fmt.Fprintf(e.w, "id: %d\nevent: %s\ndata: %s\n\n", e.id, event, b); err != nil {
		return fmt.Errorf("write %s event: %w", event, err)
	}
	return e.rc.Flush()
}

// OutputEvent is the data of a stdout or stderr SSE event. Data is the
// output as a string; DataB64 replaces it when the chunk is not valid
// UTF-8.
type OutputEvent struct {
	Data    string `json:"data,omitempty"`
	DataB64 string `json:"data_b64,omitempty"`
}

func outputEvent(b []byte) OutputEvent {
	if utf8Valid(b) {
		return OutputEvent{Data: string(b)}
	}
	return OutputEvent{DataB64: base64.StdEncoding.EncodeToString(b)}
}

// streamProcess relays a process's events as SSE until it exits or ctx
// ends; it returns the outcome. oomed, if set, says whether the
// out-of-memory killer acted since the process started.
func (s *Server) streamProcess(ctx context.Context, w http.ResponseWriter, p *agent.Process, start time.Time, oomed func() bool) ExecResult {
	sse := newSSE(w)
	res := ExecResult{Pid: p.Pid}
	if err := sse.send("start", map[string]int{"pid": p.Pid}); err != nil {
		res.Status, res.ExitCode = "error", -1
		return res
	}
	for {
		select {
		case ev, ok := <-p.Events():
			if !ok {
				res.Status, res.ExitCode = "error", -1
				res.DurationMS = ms(time.Since(start))
				sse.send("error", map[string]string{"message": "stream ended without an exit"})
				return res
			}
			switch ev.Type {
			case agent.EventStdout, agent.EventStderr:
				if err := sse.send(ev.Type, outputEvent(ev.Data)); err != nil {
					res.Status, res.ExitCode = "error", -1
					return res
				}
			case agent.EventExit:
				res.ExitCode, res.Signal = ev.ExitCode, ev.Signal
				res.Status = status(agent.ExitStatus{Code: ev.ExitCode, Signal: ev.Signal}, nil, ctx)
				if res.Signal == "SIGKILL" && oomed != nil && oomed() {
					res.Status = "oom"
				}
				res.DurationMS = ms(time.Since(start))
				sse.send("exit", map[string]any{"exit_code": ev.ExitCode, "signal": ev.Signal,
					"status": res.Status, "duration_ms": res.DurationMS})
				return res
			}
		case <-ctx.Done():
			res.Status, res.ExitCode = "timeout", -1
			res.DurationMS = ms(time.Since(start))
			sse.send("exit", map[string]any{"exit_code": -1, "status": "timeout", "duration_ms": res.DurationMS})
			return res
		}
	}
}

func pidParam(r *http.Request) (int, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return 0, errf(400, "bad_request", "bad pid %q", r.PathValue("pid"))
	}
	return pid, nil
}

func (s *Server) processes(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	ps, err := sb.Agent().Processes(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, 200, map[string]any{"processes": processViews(ps)})
	return nil
}

// StdinRequest is the body of POST .../processes/{pid}/stdin.
type StdinRequest struct {
	Data  string `json:"data"`
	Close bool   `json:"close,omitempty"`
}

func (s *Server) stdin(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	var req StdinRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if err := sb.Agent().WriteStdin(r.Context(), pid, []byte(req.Data), req.Close); err != nil {
		return procErr(pid, err)
	}
	writeJSON(w, 200, map[string]int{"written": len(req.Data)})
	return nil
}

// SignalRequest is the body of POST .../processes/{pid}/signal.
type SignalRequest struct {
	// Signal is a name (SIGTERM, TERM, KILL, INT, HUP, QUIT, USR1, USR2,
	// STOP, CONT) or a number.
	Signal string `json:"signal"`
}

var signalNames = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "STOP": syscall.SIGSTOP,
	"CONT": syscall.SIGCONT, "ALRM": syscall.SIGALRM,
}

func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 65 {
		return syscall.Signal(n), nil
	}
	if sig, ok := signalNames[strings.TrimPrefix(strings.ToUpper(s), "SIG")]; ok {
		return sig, nil
	}
	return 0, errf(400, "bad_request", "unknown signal %q", s)
}

func (s *Server) signal(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	var req SignalRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if err := sb.Agent().Signal(r.Context(), pid, sig); err != nil {
		return procErr(pid, err)
	}
	writeJSON(w, 200, map[string]string{"signal": req.Signal})
	return nil
}

// events re-attaches to a process: its buffered output, then live output
// and its exit, as SSE. Closing the request only detaches.
func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	p, err := sb.Agent().Attach(r.Context(), pid)
	if err != nil {
		return procErr(pid, err)
	}
	defer p.Close()
	s.streamProcess(r.Context(), w, p, time.Now(), nil)
	return nil
}
