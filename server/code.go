package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/interp/lang"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
)

// Code interpreter limits and audit action.
const (
	// DefaultCodeTimeout stops a cell that gives no timeout.
	DefaultCodeTimeout = 60 * time.Second
	// MaxCodeTimeout is the longest timeout a cell may ask for.
	MaxCodeTimeout = 24 * time.Hour
	// ActionCode is the audit action of a code cell.
	ActionCode = "code"
	// codeGrace is how long past its timeout the server waits for a cell
	// to report its end (the kernel's interrupt ladder) before giving up.
	codeGrace = 30 * time.Second
)

// ContextRequest is the body of POST /v1/sandboxes/{id}/contexts.
type ContextRequest struct {
	// Language is python (default), javascript or bash.
	Language string `json:"language,omitempty"`
	// Cwd is the kernel's working directory (default /workspace).
	Cwd string `json:"cwd,omitempty"`
	// Env is added to the sandbox's environment for the kernel.
	Env map[string]string `json:"env,omitempty"`
}

// CodeRequest is the body of POST /v1/sandboxes/{id}/code.
type CodeRequest struct {
	// Code is the cell's source.
	Code string `json:"code"`
	// Language picks the language's default context when ContextID is
	// empty: python (default), javascript or bash.
	Language string `json:"language,omitempty"`
	// ContextID names a context made with POST .../contexts.
	ContextID string `json:"context_id,omitempty"`
	// Timeout in seconds interrupts the cell (TimeoutError); default 60.
	Timeout float64 `json:"timeout,omitempty"`
	// MaxOutput caps stdout plus stderr in bytes (default 1 MiB, at most
	// 16 MiB); more is dropped and truncated set.
	MaxOutput int `json:"max_output,omitempty"`
	// Env sets environment variables for this cell only (the kernel and the
	// processes the cell starts); at most 128, names [A-Za-z_][A-Za-z0-9_]*.
	Env map[string]string `json:"env,omitempty"`
}

// CodeError is the error that ended a cell.
type CodeError struct {
	Name      string   `json:"name"`
	Value     string   `json:"value"`
	Traceback []string `json:"traceback"`
}

// CodeResult is the JSON result of a cell.
type CodeResult struct {
	ExecutionID    string `json:"execution_id"`
	ContextID      string `json:"context_id"`
	ExecutionCount int    `json:"execution_count"`
	Stdout         string `json:"stdout"`
	Stderr         string `json:"stderr"`
	// Results are MIME bundles (mime type → data; binary types base64).
	Results []map[string]string `json:"results"`
	// Text is the text/plain of the main result (the value of the last
	// expression), if any.
	Text       string     `json:"text,omitempty"`
	Error      *CodeError `json:"error,omitempty"`
	Truncated  bool       `json:"truncated"`
	Restarted  bool       `json:"restarted"`
	DurationMS float64    `json:"duration_ms"`
	// Status is "oom" when the sandbox's out-of-memory killer ended the
	// cell's kernel (Error then says KernelDied); absent otherwise.
	Status string `json:"status,omitempty"`
}

func codeErr(e *agent.CellError) *CodeError {
	if e == nil {
		return nil
	}
	tb := e.Traceback
	if tb == nil {
		tb = []string{}
	}
	return &CodeError{Name: e.Name, Value: e.Value, Traceback: tb}
}

// codeAgentErr maps agent errors of the interpreter requests to API errors.
func codeAgentErr(err error) error {
	var ae *agent.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case agent.CodeNotFound:
			return errf(404, "not_found", "%s", ae.Message)
		case agent.CodeUnsupported:
			return errf(400, "unsupported", "%s", ae.Message)
		case agent.CodeInvalidArgument, agent.CodeNotADirectory:
			return errf(400, "bad_request", "%s", ae.Message)
		case agent.CodeNameTooLong:
			return errf(400, "name_too_long", "%s", ae.Message)
		case agent.CodeTooLarge, agent.CodeLimit:
			return errf(429, "limit_reached", "%s", ae.Message)
		case agent.CodeExists:
			return errf(409, "conflict", "%s", ae.Message)
		case agent.CodeTimeout:
			return errf(504, "timeout", "%s", ae.Message)
		}
	}
	return err
}

func envList(m map[string]string) ([]string, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(m[k], 0) {
			return nil, errf(400, "bad_request", "bad environment variable %q", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+m[k])
	}
	return env, nil
}

func (s *Server) codeRoutes(authed func(string, handler)) {
	authed("POST /v1/sandboxes/{id}/contexts", s.createContext)
	authed("GET /v1/sandboxes/{id}/contexts", s.listContexts)
	authed("POST /v1/sandboxes/{id}/contexts/{cid}/restart", s.restartContext)
	authed("DELETE /v1/sandboxes/{id}/contexts/{cid}", s.deleteContext)
	authed("POST /v1/sandboxes/{id}/code", s.runCode)
	authed("DELETE /v1/sandboxes/{id}/code/{eid}", s.interruptCode)
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) error {
	var req ContextRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	env, err := envList(req.Env)
	if err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	l, ok := lang.Canonical(req.Language)
	if !ok {
		return errf(400, "unsupported", "language %q is not supported (python, javascript, typescript, bash)", req.Language)
	}
	// A context's kernel starts with the caller's environment and working
	// directory (BASH_ENV, PYTHONPATH...): it is put to the approval
	// policy, and audited, as code of its language. Fail closed.
	if err := s.m.AuditFirst(r.Context(), caller(r).id, sb.ID, manager.ActionCodeContext,
		map[string]any{"language": l, "cwd": req.Cwd, "env_keys": len(env)}); err != nil {
		return err
	}
	info, err := sb.Agent().CreateContext(r.Context(), agent.ContextRequest{Language: l, Cwd: req.Cwd, Env: env})
	if err != nil {
		return codeAgentErr(err)
	}
	writeJSON(w, 201, info)
	return nil
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	list, err := sb.Agent().Contexts(r.Context())
	if err != nil {
		return codeAgentErr(err)
	}
	if list == nil {
		list = []agent.ContextInfo{}
	}
	writeJSON(w, 200, map[string]any{"contexts": list})
	return nil
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	cid := r.PathValue("cid")
	if err := sb.Agent().RestartContext(r.Context(), cid); err != nil {
		return codeAgentErr(err)
	}
	writeJSON(w, 200, map[string]string{"id": cid})
	return nil
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if err := sb.Agent().DeleteContext(r.Context(), r.PathValue("cid")); err != nil {
		return codeAgentErr(err)
	}
	w.WriteHeader(204)
	return nil
}

func (s *Server) interruptCode(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	eid := r.PathValue("eid")
	if err := sb.Agent().InterruptCode(r.Context(), eid); err != nil {
		return codeAgentErr(err)
	}
	writeJSON(w, 200, map[string]string{"execution_id": eid})
	return nil
}

func (s *Server) runCode(w http.ResponseWriter, r *http.Request) error {
	var req CodeRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.Code == "" {
		return errf(400, "bad_request", "code is required: the cell's source")
	}
	if strings.IndexByte(req.Code, 0) >= 0 {
		return errf(400, "bad_request", "code contains a NUL byte")
	}
	timeout, err := seconds(req.Timeout)
	if err != nil {
		return err
	}
	if timeout == 0 {
		timeout = DefaultCodeTimeout
	}
	if timeout > MaxCodeTimeout {
		return errf(400, "bad_request", "timeout must be at most %d seconds", int(MaxCodeTimeout.Seconds()))
	}
	if req.MaxOutput < 0 || req.MaxOutput > MaxMaxOutput {
		return errf(400, "bad_request", "max_output must be between 0 and %d", MaxMaxOutput)
	}
	maxOut := req.MaxOutput
	if maxOut == 0 {
		maxOut = DefaultMaxOutput
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	k := caller(r)
	// The approval gate decides on the language that will run: a cell in
	// a context runs the context's, whatever the request says.
	creq := agent.CodeRequest{ContextID: req.ContextID, Language: req.Language}
	language, err := sb.Agent().CellLanguage(r.Context(), creq)
	if err != nil {
		return codeAgentErr(err)
	}
	sum := sha256.Sum256([]byte(req.Code))
	audit := map[string]any{"code_sha256": hex.EncodeToString(sum[:]), "code_bytes": len(req.Code),
		"language": language, "context_id": req.ContextID}
	res := CodeResult{ExecutionID: agent.NewExecID(), Results: []map[string]string{}}
	audit["execution_id"] = res.ExecutionID
	start := time.Now()
	if len(req.Env) > 128 {
		return errf(http.StatusBadRequest, "bad_request", "at most 128 environment variables per cell")
	}
	env := make([]string, 0, len(req.Env))
	for k, v := range req.Env {
		if !policy.ValidEnvKey(k) || strings.IndexByte(v, 0) >= 0 || len(v) > 32<<10 {
			return errf(http.StatusBadRequest, "bad_request", "bad environment variable %q", k)
		}
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	// Fail closed: no cell runs unless its audit record is written; the
	// outcome follows as ActionCode+".result".
	if err := s.m.AuditFirst(r.Context(), k.id, sb.ID, ActionCode, audit); err != nil {
		return err
	}
	oom0 := sb.OOMKills()
	cell, err := sb.Agent().RunCode(r.Context(), agent.CodeRequest{ID: res.ExecutionID, Code: req.Code,
		ContextID: req.ContextID, Language: language, Timeout: timeout, MaxOutput: maxOut, Env: env})
	if err != nil {
		audit["outcome"], audit["error"] = "failed", err.Error()
		s.m.Audit(r.Context(), k.id, sb.ID, ActionCode+".result", audit)
		return codeAgentErr(err)
	}
	defer cell.Close() // interrupts the cell if the client went away
	ctx, cancel := context.WithTimeout(r.Context(), timeout+codeGrace)
	defer cancel()
	var end agent.CodeResult
	if wantsSSE(r) {
		end, err = s.streamCell(ctx, w, cell, &res, start)
	} else {
		var out agent.Collected
		out, err = cell.Collect(ctx, maxOut)
		if err == nil {
			end = out.CodeResult
			res.Stdout, res.Stderr, res.Truncated = out.Stdout, out.Stderr, out.Truncated
			for _, ev := range out.Results {
				res.Results = append(res.Results, ev.Data)
				if ev.Main {
					res.Text = ev.Data["text/plain"]
				}
			}
		}
	}
	res.DurationMS = ms(time.Since(start))
	if err != nil {
		audit["outcome"], audit["error"] = "failed", err.Error()
		s.m.Audit(r.Context(), k.id, sb.ID, ActionCode+".result", audit)
		if wantsSSE(r) {
			return nil // the stream has started; it says what happened
		}
		if ae := codeAgentErr(err); ae != err {
			return ae
		}
		return errf(502, "internal", "the cell did not complete: %v", err)
	}
	res.ContextID, res.ExecutionCount, res.Restarted = end.ContextID, end.ExecutionCount, end.Restarted
	res.Error = codeErr(end.Error)
	if res.Error != nil && res.Error.Name == "KernelDied" && sb.OOMedSince(oom0) {
		res.Status = "oom"
		res.Error.Value += " (killed by the out-of-memory killer: the cell needed more than the sandbox's memory limit)"
	}
	res.Truncated = res.Truncated || end.Truncated
	audit["context_id"], audit["execution_count"], audit["duration_ms"] = end.ContextID, end.ExecutionCount, res.DurationMS
	audit["truncated"], audit["restarted"] = res.Truncated, res.Restarted
	audit["outcome"] = cellOutcome(end.Error)
	if end.Error != nil {
		audit["error_name"] = end.Error.Name
	}
	s.m.Audit(r.Context(), k.id, sb.ID, ActionCode+".result", audit)
	if !wantsSSE(r) {
		writeJSON(w, 200, res)
	}
	return nil
}

// cellOutcome classifies a cell's end for the audit log.
func cellOutcome(e *agent.CellError) string {
	switch {
	case e == nil:
		return "ok"
	case e.Name == "TimeoutError":
		return "timeout"
	case e.Name == "KeyboardInterrupt":
		return "interrupted"
	case e.Name == "KernelDied" || e.Name == "KernelRestarted":
		return "crashed"
	}
	return "error"
}

// ResultEvent is the data of a result SSE event.
type ResultEvent struct {
	Data map[string]string `json:"data"`
	Main bool              `json:"main,omitempty"`
}

// streamCell relays a cell's outputs as SSE: start, stdout, stderr,
// result, error, and end with the outcome.
func (s *Server) streamCell(ctx context.Context, w http.ResponseWriter, cell *agent.Cell, res *CodeResult, start time.Time) (agent.CodeResult, error) {
	sse := newSSE(w)
	if err := sse.send("start", map[string]string{"execution_id": res.ExecutionID}); err != nil {
		return agent.CodeResult{}, err
	}
	var errEv *agent.CellError
	for {
		select {
		case ev, ok := <-cell.Events():
			if !ok {
				end, err := cell.Wait(ctx)
				if err != nil {
					sse.send("error", map[string]string{"name": "InternalError", "value": err.Error()})
					sse.send("end", map[string]any{"execution_id": res.ExecutionID, "status": "failed"})
					return end, err
				}
				if end.Error == nil {
					end.Error = errEv
				}
				sse.send("end", map[string]any{"execution_id": res.ExecutionID, "context_id": end.ContextID,
					"execution_count": end.ExecutionCount, "error": codeErr(end.Error), "truncated": end.Truncated,
					"restarted": end.Restarted, "duration_ms": ms(time.Since(start))})
				return end, nil
			}
			var err error
			switch ev.Type {
			case agent.CodeEventStdout, agent.CodeEventStderr:
				err = sse.send(ev.Type, outputEvent([]byte(ev.Text)))
			case agent.CodeEventResult:
				err = sse.send("result", ResultEvent{Data: ev.Data, Main: ev.Main})
			case agent.CodeEventError:
				errEv = ev.Error
				err = sse.send("error", codeErr(ev.Error))
			}
			if err != nil {
				return agent.CodeResult{}, err
			}
		case <-ctx.Done():
			sse.send("end", map[string]any{"execution_id": res.ExecutionID, "status": "timeout"})
			return agent.CodeResult{}, ctx.Err()
		}
	}
}
