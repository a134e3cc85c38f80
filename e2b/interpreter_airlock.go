package e2b

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/manager"
)

// AgentInterpreter is the Interpreter of airlock's sandboxes: contexts are
// interpreter kernels hosted by each sandbox's agent (agent.Client's
// CreateContext, RunCode...). The zero value is ready to use.
type AgentInterpreter struct{}

var _ Interpreter = AgentInterpreter{}

// interpErr maps the agent's errors to the Interpreter's.
func interpErr(err error) error {
	var ae *agent.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case agent.CodeNotFound:
			return fmt.Errorf("%w: %s", ErrContextNotFound, ae.Message)
		case agent.CodeUnsupported:
			return fmt.Errorf("%w: %s", ErrLanguage, ae.Message)
		}
	}
	return err
}

func contextOf(c agent.ContextInfo) CodeContext {
	return CodeContext{ID: c.ID, Language: c.Language, Cwd: c.Cwd}
}

// CreateContext implements Interpreter. A working directory that does not
// exist, is not a directory or cannot be entered is ErrBadCwd.
func (AgentInterpreter) CreateContext(ctx context.Context, sb *manager.Sandbox, language, cwd string) (CodeContext, error) {
	c, err := sb.Agent().CreateContext(ctx, agent.ContextRequest{Language: language, Cwd: cwd})
	var ae *agent.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case agent.CodeNotFound, agent.CodeNotADirectory, agent.CodePermissionDenied:
			return CodeContext{}, fmt.Errorf("%w: %s", ErrBadCwd, ae.Message)
		}
	}
	if err != nil {
		return CodeContext{}, interpErr(err)
	}
	return contextOf(c), nil
}

// defaultLanguages have a context in every sandbox, as on E2B: the agent
// starts its kernel at the first cell that needs it, and until then it is
// listed with its language as its id.
var defaultLanguages = []string{"python", "javascript"}

// Contexts implements Interpreter: the sandbox's contexts, the default
// ones first (python, then javascript, started or not, as E2B's kernel
// lists them), then the others in the order the agent gives.
func (AgentInterpreter) Contexts(ctx context.Context, sb *manager.Sandbox) ([]CodeContext, error) {
	list, err := sb.Agent().Contexts(ctx)
	if err != nil {
		return nil, interpErr(err)
	}
	out := make([]CodeContext, 0, len(list)+len(defaultLanguages))
	started := map[string]CodeContext{}
	for _, c := range list {
		started[c.ID] = contextOf(c)
	}
	for _, l := range defaultLanguages {
		if c, ok := started[l]; ok {
			out = append(out, c)
		} else {
			out = append(out, CodeContext{ID: l, Language: l, Cwd: sandboxHome})
		}
	}
	for _, c := range list {
		if !defaultContext(c.ID) {
			out = append(out, contextOf(c))
		}
	}
	return out, nil
}

// defaultContext reports whether id names a default context.
func defaultContext(id string) bool {
	for _, l := range defaultLanguages {
		if id == l {
			return true
		}
	}
	return false
}

// RemoveContext implements Interpreter. A default context that has not
// started has nothing to stop.
func (AgentInterpreter) RemoveContext(ctx context.Context, sb *manager.Sandbox, id string) error {
	err := interpErr(sb.Agent().DeleteContext(ctx, id))
	if errors.Is(err, ErrContextNotFound) && defaultContext(id) {
		return nil
	}
	return err
}

// RestartContext implements Interpreter. Restarting a default context that
// has not started leaves it fresh, as it is.
func (AgentInterpreter) RestartContext(ctx context.Context, sb *manager.Sandbox, id string) error {
	err := interpErr(sb.Agent().RestartContext(ctx, id))
	if errors.Is(err, ErrContextNotFound) && defaultContext(id) {
		return nil
	}
	return err
}

// Execute implements Interpreter. The cell has no timeout of its own: the
// SDK's request timeout ends ctx, which interrupts it.
func (AgentInterpreter) Execute(ctx context.Context, sb *manager.Sandbox, req CellRequest, emit func(CellOutput)) (CellEnd, error) {
	var env []string
	if len(req.Env) > 0 {
		keys := make([]string, 0, len(req.Env))
		for k := range req.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			env = append(env, k+"="+req.Env[k])
		}
	}
	switch {
	case defaultContext(req.ContextID):
		// The agent starts a default context at its first cell.
		req.Language, req.ContextID = req.ContextID, ""
	case req.ContextID != "" && req.Started != nil:
		// The agent reports a missing context only in the cell's stream,
		// which Started begins: look first, so that it is a 404.
		list, err := sb.Agent().Contexts(ctx)
		if err != nil {
			return CellEnd{}, interpErr(err)
		}
		if !slices.ContainsFunc(list, func(c agent.ContextInfo) bool { return c.ID == req.ContextID }) {
			return CellEnd{}, fmt.Errorf("%w: %s", ErrContextNotFound, req.ContextID)
		}
	}
	cell, err := sb.Agent().RunCode(ctx, agent.CodeRequest{Code: req.Code, ContextID: req.ContextID,
		Language: req.Language, Env: env, Cwd: req.Cwd})
	if err != nil {
		return CellEnd{}, interpErr(err)
	}
	defer cell.Close() // interrupts the cell if ctx ended first
	if req.Started != nil {
		req.Started()
	}
	sawError := false
	// E2B's kernels deliver output a line at a time (print("a", x) is one
	// "a 41\n" message); ours stream each write. Whole lines are passed on
	// as they complete, a partial line when something else must follow it.
	pending := map[string]string{}
	flush := func(typ string) {
		if pending[typ] != "" {
			emit(CellOutput{Type: typ, Text: pending[typ]})
			pending[typ] = ""
		}
	}
	flushAll := func() {
		flush(agent.CodeEventStdout)
		flush(agent.CodeEventStderr)
	}
	for {
		select {
		case ev, ok := <-cell.Events():
			if !ok {
				flushAll()
				end, err := cell.Wait(ctx)
				if err != nil {
					return CellEnd{}, interpErr(err)
				}
				if end.Error != nil && !sawError {
					emit(CellOutput{Type: "error", Error: cellErr(end.Error)})
				}
				return CellEnd{ExecutionCount: end.ExecutionCount}, nil
			}
			switch ev.Type {
			case agent.CodeEventStdout, agent.CodeEventStderr:
				other := agent.CodeEventStderr
				if ev.Type == agent.CodeEventStderr {
					other = agent.CodeEventStdout
				}
				flush(other) // keep the interleaving of the two streams
				buf := pending[ev.Type] + ev.Text
				if i := strings.LastIndexByte(buf, '\n'); i >= 0 {
					emit(CellOutput{Type: ev.Type, Text: buf[:i+1]})
					buf = buf[i+1:]
				}
				if len(buf) > 64<<10 { // a long line without newline: do not hold it back
					emit(CellOutput{Type: ev.Type, Text: buf})
					buf = ""
				}
				pending[ev.Type] = buf
			case agent.CodeEventResult:
				flushAll()
				emit(CellOutput{Type: "result", Data: ev.Data, Main: ev.Main})
			case agent.CodeEventError:
				flushAll()
				sawError = true
				emit(CellOutput{Type: "error", Error: cellErr(ev.Error)})
			}
		case <-ctx.Done():
			return CellEnd{}, ctx.Err()
		}
	}
}

func cellErr(e *agent.CellError) *CellError {
	if e == nil {
		return &CellError{Name: "Error"}
	}
	return &CellError{Name: e.Name, Value: e.Value, Traceback: e.Traceback}
}
