package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/interp/lang"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/store"
)

// The code interpreter's port (49999): POST /execute runs a cell and
// answers newline-delimited JSON; /contexts creates, lists and removes
// persistent contexts; /contexts/{id}/restart restarts one. The cells run
// in airlock's interpreter kernels inside the sandbox, reached through
// Config.Interpreter; without one, every endpoint but /health answers 501.

// Interpreter runs code cells in persistent interpreter contexts inside a
// sandbox: variables, imports and the working directory of a context
// survive between its cells. airlock's interpreter integration implements
// it.
type Interpreter interface {
	// CreateContext starts a context for language in cwd (a sandbox path;
	// "" means the workspace).
	CreateContext(ctx context.Context, sb *manager.Sandbox, language, cwd string) (CodeContext, error)
	// Contexts lists the sandbox's contexts.
	Contexts(ctx context.Context, sb *manager.Sandbox) ([]CodeContext, error)
	// RemoveContext stops a context.
	RemoveContext(ctx context.Context, sb *manager.Sandbox, id string) error
	// RestartContext replaces a context's interpreter with a fresh one,
	// keeping its id, language and cwd.
	RestartContext(ctx context.Context, sb *manager.Sandbox, id string) error
	// Execute runs a cell. It calls emit with each output as the cell
	// produces it, in order, and returns when the cell has ended. A
	// failure of the code is an output of type "error", not an error:
	// Execute's error means the cell could not run (ErrContextNotFound,
	// ErrLanguage, the sandbox is gone...). Cancelling ctx interrupts the
	// cell.
	Execute(ctx context.Context, sb *manager.Sandbox, req CellRequest, emit func(CellOutput)) (CellEnd, error)
}

// Errors an Interpreter returns (wrapped) for the E2B status codes.
var (
	// ErrContextNotFound: no context with that id.
	ErrContextNotFound = errors.New("context not found")
	// ErrLanguage: the language is not available.
	ErrLanguage = errors.New("language not supported")
	// ErrBadCwd: a context's working directory does not exist in the
	// sandbox or cannot be entered.
	ErrBadCwd = errors.New("bad working directory")
)

// CodeContext describes a context.
type CodeContext struct {
	ID       string
	Language string
	// Cwd is the context's working directory, a sandbox path.
	Cwd string
}

// CellRequest is one cell to run.
type CellRequest struct {
	// ContextID names the context; empty means the default context of
	// Language.
	ContextID string
	// Language is used when ContextID is empty; empty means python.
	Language string
	// Code is the cell.
	Code string
	// Env holds environment variables for this cell only.
	Env map[string]string
	// Cwd is where a default context that this cell starts works (a
	// sandbox path; "" is the workspace).
	Cwd string
	// Started, if set, is called once the cell has been accepted (its
	// context exists and its kernel runs), before its first output: the
	// response can begin then, so that a client's request timer stops
	// however long the cell stays silent.
	Started func()
}

// CellOutput is one output of a cell.
type CellOutput struct {
	// Type is "stdout", "stderr", "result" or "error".
	Type string
	// Text is the text of stdout and stderr.
	Text string
	// Data is a result's MIME bundle: text types as text, binary types
	// (image/png, image/jpeg, application/pdf) base64, JSON types JSON
	// text.
	Data map[string]string
	// Main marks the result that is the value of the cell's last
	// expression (Jupyter's execute_result), as opposed to figures and
	// display() calls.
	Main bool
	// Error is the exception that ended the cell, for "error".
	Error *CellError
}

// CellError is an exception raised by a cell.
type CellError struct {
	Name, Value string
	Traceback   []string
}

// CellEnd is how a cell ended.
type CellEnd struct {
	// ExecutionCount numbers the cells run in the context.
	ExecutionCount int
}

// mimeKeys maps MIME types to the fields of E2B's result messages.
var mimeKeys = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
	"image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
	"application/json": "json", "application/javascript": "javascript",
	// E2B's own: a DataFrame's columns, a chart's data.
	"e2b/data": "data", "e2b/chart": "chart",
}

// resultMessage converts a MIME bundle to E2B's result message.
func resultMessage(o CellOutput) map[string]any {
	m := map[string]any{"type": "result", "is_main_result": o.Main}
	extra := map[string]any{}
	for mt, v := range o.Data {
		key, known := mimeKeys[mt]
		var val any = v
		if strings.HasSuffix(mt, "json") || strings.HasPrefix(mt, "e2b/") {
			// JSON types travel as JSON values, not strings.
			if json.Valid([]byte(v)) {
				val = json.RawMessage(v)
			}
		}
		if !known {
			extra[mt] = val
			continue
		}
		if key == "text" && len(v) >= 2 && strings.HasPrefix(v, "'") && strings.HasSuffix(v, "'") {
			// E2B's server shows a string result without its repr quotes.
			val = v[1 : len(v)-1]
		}
		m[key] = val
	}
	if len(extra) > 0 {
		// Nested, as E2B's server sends them: the Python SDK builds its
		// Result from the message's keys and rejects unknown ones.
		m["extra"] = extra
	}
	return m
}

// ndjson writes newline-delimited JSON messages, flushing each.
type ndjson struct {
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
	ok bool
}

func (n *ndjson) write(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.ok {
		return
	}
	if _, err := n.w.Write(append(b, '\n')); err != nil {
		n.ok = false
		return
	}
	n.rc.Flush()
}

// writePlain answers like E2B's interpreter server does for errors: plain
// text (the SDKs show it for 404 and 502).
func writePlain(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	io.WriteString(w, msg)
}

// interpStatus maps an Interpreter error to a status.
func interpStatus(err error) int {
	switch {
	case errors.Is(err, ErrContextNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrLanguage), errors.Is(err, ErrBadCwd):
		// Not 400: the SDKs show the body of a 404 (and 502) only, and
		// both are something the sandbox does not have.
		return http.StatusNotFound
	case errors.Is(err, context.Canceled):
		return 499
	}
	if ce := agentRPCError(err); ce.Code == CodeUnavailable {
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}

// cellLanguage is the language a cell will run: its context's when it
// names one (ErrContextNotFound without such a context), else the one it
// asks for, canonical when known (the kernels refuse the others).
func (h *Handler) cellLanguage(ctx context.Context, b *boxState, contextID, language string) (string, error) {
	if contextID == "" {
		if l, ok := lang.Canonical(language); ok {
			return l, nil
		}
		return language, nil
	}
	list, err := h.cfg.Interpreter.Contexts(ctx, b.sb)
	if err != nil {
		return "", err
	}
	for _, c := range list {
		if c.ID == contextID {
			return c.Language, nil
		}
	}
	return "", fmt.Errorf("%w: %s", ErrContextNotFound, contextID)
}

// auditStatus is the HTTP status of a refusal by AuditFirst: 403 for the
// approval policy, 507 for a full disk, 503 for a log that cannot be
// written.
func auditStatus(err error) int {
	var apr *approval.Error
	switch {
	case errors.As(err, &apr):
		return http.StatusForbidden
	case errors.Is(err, store.ErrNoSpace):
		return http.StatusInsufficientStorage
	}
	return http.StatusServiceUnavailable
}

// readInterpJSON decodes an optional JSON body of at most max bytes.
func readInterpJSON(r *http.Request, max int64, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		return err
	}
	if int64(len(b)) > max {
		return errors.New("request body too large")
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	return json.Unmarshal(b, v)
}

// contextJSON is E2B's Context.
type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func contextOut(c CodeContext) contextJSON {
	return contextJSON{ID: c.ID, Language: c.Language, Cwd: fromSandbox(c.Cwd)}
}

// serveInterpreter serves the code interpreter's port.
func (h *Handler) serveInterpreter(w http.ResponseWriter, r *http.Request, b *boxState) {
	p := r.URL.Path
	if p == "/health" {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `"OK"`)
		return
	}
	in := h.cfg.Interpreter
	if in == nil {
		writePlain(w, http.StatusNotImplemented, "the code interpreter (runCode, code contexts) is not available on this airlock server: it has no interpreter kernels for sandboxes\n")
		return
	}
	ctx, sb := r.Context(), b.sb
	switch {
	case p == "/execute" && r.Method == http.MethodPost:
		h.execute(w, r, b)
	case p == "/contexts" && r.Method == http.MethodPost:
		var req struct {
			Language string `json:"language"`
			Cwd      string `json:"cwd"`
		}
		if err := readInterpJSON(r, 1<<20, &req); err != nil {
			writePlain(w, http.StatusBadRequest, "bad request: "+err.Error())
			return
		}
		if req.Language == "" {
			req.Language = "python"
		}
		cwd, ok := workDir(b.homeDir(ctx), req.Cwd)
		if !ok {
			writePlain(w, http.StatusBadRequest, "bad cwd")
			return
		}
		// A context is code of its language (its kernel starts in the
		// caller's cwd): put to the approval policy and audited first.
		l, known := lang.Canonical(req.Language)
		if !known {
			l = req.Language
		}
		if err := h.m.AuditFirst(ctx, sb.Owner(), sb.ID, manager.ActionCodeContext,
			map[string]any{"via": "e2b", "language": l, "cwd": cwd}); err != nil {
			writePlain(w, auditStatus(err), "failed to create context: "+err.Error())
			return
		}
		c, err := in.CreateContext(ctx, sb, req.Language, cwd)
		switch {
		case errors.Is(err, ErrBadCwd):
			writePlain(w, interpStatus(err), fmt.Sprintf("failed to create context: cwd %s cannot be the working directory (%v); E2B code works in %s", req.Cwd, err, E2BHome))
			return
		case errors.Is(err, ErrLanguage):
			writePlain(w, interpStatus(err), fmt.Sprintf("failed to create context: language %q is not available in this sandbox (%v)", req.Language, err))
			return
		case err != nil:
			writePlain(w, interpStatus(err), "failed to create context: "+err.Error())
			return
		}
		writeJSON(w, http.StatusOK, contextOut(c))
	case p == "/contexts" && r.Method == http.MethodGet:
		list, err := in.Contexts(ctx, sb)
		if err != nil {
			writePlain(w, interpStatus(err), err.Error())
			return
		}
		out := make([]contextJSON, 0, len(list))
		for _, c := range list {
			out = append(out, contextOut(c))
		}
		writeJSON(w, http.StatusOK, out)
	case strings.HasPrefix(p, "/contexts/") && strings.HasSuffix(p, "/restart") && r.Method == http.MethodPost:
		id := strings.TrimSuffix(strings.TrimPrefix(p, "/contexts/"), "/restart")
		if err := in.RestartContext(ctx, sb, id); err != nil {
			writePlain(w, interpStatus(err), "failed to restart context "+id+": "+err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "restarted"})
	case strings.HasPrefix(p, "/contexts/") && !strings.Contains(p[len("/contexts/"):], "/") && r.Method == http.MethodDelete:
		id := p[len("/contexts/"):]
		if err := in.RemoveContext(ctx, sb, id); err != nil {
			writePlain(w, interpStatus(err), "failed to remove context "+id+": "+err.Error())
			return
		}
		w.WriteHeader(http.StatusOK)
	default:
		writePlain(w, http.StatusNotFound, r.Method+" "+p+" is not a code interpreter endpoint\n")
	}
}

// executeRequest is the body of POST /execute.
type executeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// execute runs a cell and streams its outputs as newline-delimited JSON:
// stdout and stderr ({"type", "text", "timestamp"}), results (MIME types
// as E2B's fields, is_main_result), the error ({"name", "value",
// "traceback"}), then number_of_executions and end_of_execution.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request, b *boxState) {
	var req executeRequest
	if err := readInterpJSON(r, 16<<20, &req); err != nil {
		writePlain(w, http.StatusBadRequest, "bad request: "+err.Error())
		return
	}
	if req.ContextID != "" && req.Language != "" {
		writePlain(w, http.StatusBadRequest, "give context_id or language, not both")
		return
	}
	if _, err := envList(req.EnvVars); err != nil {
		writePlain(w, http.StatusBadRequest, err.Error())
		return
	}
	out := &ndjson{w: w, rc: http.NewResponseController(w)}
	begun := false
	start := func() {
		if !begun {
			begun = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusOK)
			out.ok = true
			// Send the headers now: the SDKs' request timeout runs until
			// they arrive, the cell's own timeout (timeoutMs) after.
			out.rc.Flush()
		}
	}
	var mu sync.Mutex
	emit := func(o CellOutput) {
		mu.Lock()
		defer mu.Unlock()
		start()
		now := time.Now().UnixNano()
		switch o.Type {
		case "stdout", "stderr":
			out.write(map[string]any{"type": o.Type, "text": o.Text, "timestamp": now})
		case "result":
			out.write(resultMessage(o))
		case "error":
			e := o.Error
			if e == nil {
				e = &CellError{Name: "Error"}
			}
			out.write(map[string]any{"type": "error", "name": e.Name, "value": e.Value,
				"traceback": strings.Join(e.Traceback, "\n")})
		}
	}
	started := func() {
		mu.Lock()
		defer mu.Unlock()
		start()
	}
	// The approval gate decides on the language that will run: a cell in
	// a context runs the context's.
	language, err := h.cellLanguage(r.Context(), b, req.ContextID, req.Language)
	if err != nil {
		msg := err.Error()
		if errors.Is(err, ErrContextNotFound) {
			msg = "Context " + req.ContextID + " not found"
		}
		writePlain(w, interpStatus(err), msg)
		return
	}
	// Fail closed, as the API's /code: no cell runs unless its audit
	// record is written; the outcome follows as "code.result".
	sum := sha256.Sum256([]byte(req.Code))
	audit := map[string]any{"via": "e2b", "code_sha256": hex.EncodeToString(sum[:]), "code_bytes": len(req.Code),
		"language": language, "context_id": req.ContextID}
	if err := h.m.AuditFirst(r.Context(), b.sb.Owner(), b.sb.ID, manager.ActionCodeCell, audit); err != nil {
		writePlain(w, auditStatus(err), err.Error())
		return
	}
	end, err := h.cfg.Interpreter.Execute(r.Context(), b.sb, CellRequest{ContextID: req.ContextID,
		Language: req.Language, Code: req.Code, Env: req.EnvVars, Cwd: b.homeDir(r.Context()), Started: started}, emit)
	if err != nil {
		audit["error"] = err.Error()
	} else {
		audit["execution_count"] = end.ExecutionCount
	}
	h.m.Audit(r.Context(), b.sb.Owner(), b.sb.ID, "code.result", audit)
	if err != nil && interpStatus(err) == http.StatusBadGateway {
		if why := h.sandboxEnded(r.Context(), b.sb); why != "" {
			err = fmt.Errorf("%s while the cell ran", why)
			if !begun {
				writePlain(w, http.StatusBadGateway, err.Error())
				return
			}
			// As on E2B, whose sandbox takes the connection with it: the
			// cell's error says why (onError), then the response is cut,
			// so runCode rejects, and the SDKs that check the sandbox
			// then (code interpreter 2.8+) raise E2B's TimeoutError "The
			// sandbox was killed while the request was in progress".
			emit(CellOutput{Type: "error", Error: &CellError{Name: "SandboxEnded", Value: err.Error()}})
			mu.Lock()
			out.rc.Flush()
			mu.Unlock()
			panic(http.ErrAbortHandler)
		}
	}
	if errors.Is(err, ErrLanguage) {
		// As an error of the cell, which the SDKs show (execution.error);
		// they show only the status of a 400.
		emit(CellOutput{Type: "error", Error: &CellError{Name: "LanguageNotSupported",
			Value: fmt.Sprintf("language %q is not available in this sandbox (%v)", req.Language, err)}})
		err = nil
	}
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		if !begun {
			msg := err.Error()
			if errors.Is(err, ErrContextNotFound) {
				msg = "Context " + req.ContextID + " not found"
			}
			writePlain(w, interpStatus(err), msg)
			return
		}
		// Output has been sent: report the failure in the stream.
		out.write(map[string]any{"type": "error", "name": "InterpreterError", "value": err.Error(), "traceback": ""})
		return
	}
	start()
	if end.ExecutionCount >= 0 {
		out.write(map[string]any{"type": "number_of_executions", "execution_count": end.ExecutionCount})
	}
	out.write(map[string]any{"type": "end_of_execution"})
}
