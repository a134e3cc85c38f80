package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/interp"
	"github.com/airlock-dev/airlock/interp/lang"
)

// contextStartTimeout bounds the start of a kernel.
const contextStartTimeout = 60 * time.Second

// interpHandlers are the interpreter requests, merged into handlers.
var interpHandlers = map[FrameType]handler{
	FrameCreateContext:  (*hostConn).handleCreateContext,
	FrameContexts:       (*hostConn).handleContexts,
	FrameRestartContext: (*hostConn).handleRestartContext,
	FrameDeleteContext:  (*hostConn).handleDeleteContext,
	FrameRunCode:        (*hostConn).handleRunCode,
	FrameInterruptCode:  (*hostConn).handleInterruptCode,
}

// codeState is the agent's code contexts and running cells. It is process
// wide: contexts outlive host connections.
type codeState struct {
	createMu sync.Mutex // serializes creating contexts (the default ones lazily)

	mu       sync.Mutex
	contexts map[string]*codeContext
	order    []string                // context ids, oldest first
	running  map[string]func()       // execution id → cancel
	cells    map[string]*codeContext // execution id → its context
}

// codeContext is one context: a kernel and how it was made.
type codeContext struct {
	info ContextInfo
	k    *interp.Kernel
}

var codeStates sync.Map // *agent → *codeState

func (a *agent) code() *codeState {
	if v, ok := codeStates.Load(a); ok {
		return v.(*codeState)
	}
	v, _ := codeStates.LoadOrStore(a, &codeState{
		contexts: make(map[string]*codeContext),
		running:  make(map[string]func()),
		cells:    make(map[string]*codeContext),
	})
	return v.(*codeState)
}

func parseLanguage(s string) (interp.Language, error) {
	if l, ok := lang.Canonical(s); ok {
		return interp.Language(l), nil
	}
	return "", &Error{Code: CodeUnsupported, Message: fmt.Sprintf("language %q is not supported (python, javascript, typescript, bash)", s)}
}

// startContext starts a kernel for req with the given id ("" for a random
// one) and registers it. The caller holds createMu.
func (c *hostConn) startContext(id string, req ContextRequest) (*codeContext, error) {
	lang, err := parseLanguage(req.Language)
	if err != nil {
		return nil, err
	}
	cs := c.code()
	cs.mu.Lock()
	n := len(cs.contexts)
	cs.mu.Unlock()
	if n >= MaxContexts {
		return nil, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("the sandbox has %d code contexts, the most allowed", MaxContexts)}
	}
	cwd, err := c.resolve(req.Cwd, true)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(cwd); err != nil {
		return nil, fmt.Errorf("context working directory: %w", err)
	} else if !st.IsDir() {
		return nil, &Error{Code: CodeNotADirectory, Message: fmt.Sprintf("working directory %s is not a directory", cwd)}
	}
	env, err := mergeEnv(c.env, req.Env)
	if err != nil {
		return nil, err
	}
	if id == "" {
		id = "ctx-" + NewExecID()[:16]
	}
	ctx, cancel := context.WithTimeout(context.Background(), contextStartTimeout)
	defer cancel()
	k, err := interp.Start(ctx, interp.Config{Language: lang, Cwd: cwd, Env: env, MaxResult: MaxCodeResult, QuickJS: quickJSKernel, Credential: workloadCred, AmbientCaps: workloadCaps, SysProcAttr: theWorkload.sysProcAttr, Spawn: theSpawner.run})
	if err != nil {
		return nil, startError("the "+string(lang)+" kernel", err)
	}
	cc := &codeContext{info: ContextInfo{ID: id, Language: string(lang), Cwd: cwd}, k: k}
	cs.mu.Lock()
	cs.contexts[id] = cc
	cs.order = append(cs.order, id)
	cs.mu.Unlock()
	return cc, nil
}

func (cs *codeState) lookup(id string) (*codeContext, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cc := cs.contexts[id]
	if cc == nil {
		return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("no code context %q", id)}
	}
	return cc, nil
}

func (c *hostConn) handleCreateContext(s *astream, payload []byte) (any, error) {
	var req ContextRequest
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	cs := c.code()
	cs.createMu.Lock()
	defer cs.createMu.Unlock()
	cc, err := c.startContext("", req)
	if err != nil {
		return nil, err
	}
	return cc.info, nil
}

func (c *hostConn) handleContexts(s *astream, payload []byte) (any, error) {
	if err := decodeJSON(payload, &emptyMsg{}); err != nil {
		return nil, invalid(err)
	}
	cs := c.code()
	cs.mu.Lock()
	out := contextsMsg{Contexts: make([]ContextInfo, 0, len(cs.order))}
	for _, id := range cs.order {
		out.Contexts = append(out.Contexts, cs.contexts[id].info)
	}
	cs.mu.Unlock()
	return out, nil
}

func (c *hostConn) handleRestartContext(s *astream, payload []byte) (any, error) {
	var req contextIDMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	cc, err := c.code().lookup(req.ID)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), contextStartTimeout)
	defer cancel()
	s.onGone(cancel)
	if err := cc.k.Restart(ctx); err != nil {
		return nil, kernelErr(err)
	}
	return emptyMsg{}, nil
}

func (c *hostConn) handleDeleteContext(s *astream, payload []byte) (any, error) {
	var req contextIDMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	cs := c.code()
	cs.mu.Lock()
	cc := cs.contexts[req.ID]
	if cc != nil {
		delete(cs.contexts, req.ID)
		for i, id := range cs.order {
			if id == req.ID {
				cs.order = append(cs.order[:i], cs.order[i+1:]...)
				break
			}
		}
	}
	cs.mu.Unlock()
	if cc == nil {
		return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("no code context %q", req.ID)}
	}
	cc.k.Close()
	return emptyMsg{}, nil
}

func (c *hostConn) handleInterruptCode(s *astream, payload []byte) (any, error) {
	var req contextIDMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	cs := c.code()
	cs.mu.Lock()
	cancel := cs.running[req.ID]
	cs.mu.Unlock()
	if cancel == nil {
		return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("no running cell %q", req.ID)}
	}
	cancel()
	return emptyMsg{}, nil
}

// kernelErr maps interp's errors to agent errors.
func kernelErr(err error) error {
	if errors.Is(err, interp.ErrClosed) {
		return &Error{Code: CodeNotFound, Message: "the code context was deleted"}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return startError("the kernel", err)
	}
	return err
}

// resolveCell finds the context a cell runs in, creating a language's
// default context on first use.
func (c *hostConn) resolveCell(req *runCodeMsg) (*codeContext, error) {
	cs := c.code()
	if req.ContextID != "" {
		cc, err := cs.lookup(req.ContextID)
		if err != nil || req.Language == "" {
			return cc, err
		}
		// The host names the language it gated the cell on: a context
		// of another language would run what it did not allow.
		if l, _ := lang.Canonical(req.Language); l != cc.info.Language {
			return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("code context %q runs %s, not %s", req.ContextID, cc.info.Language, req.Language)}
		}
		return cc, nil
	}
	lang, err := parseLanguage(req.Language)
	if err != nil {
		return nil, err
	}
	id := string(lang)
	if cc, err := cs.lookup(id); err == nil {
		return cc, nil
	}
	cs.createMu.Lock()
	defer cs.createMu.Unlock()
	if cc, err := cs.lookup(id); err == nil {
		return cc, nil
	}
	return c.startContext(id, ContextRequest{Language: id, Cwd: req.Cwd})
}

func (c *hostConn) handleRunCode(s *astream, payload []byte) (any, error) {
	var req runCodeMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	if !validExecID(req.ID) {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("bad execution id %q", req.ID)}
	}
	var env map[string]string
	for _, kv := range req.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.IndexByte(kv, 0) >= 0 {
			return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("bad environment entry %q", kv)}
		}
		if env == nil {
			env = make(map[string]string, len(req.Env))
		}
		env[k] = v
	}
	maxOutput := req.MaxOutput
	switch {
	case maxOutput <= 0:
		maxOutput = DefaultCodeOutput
	case maxOutput > MaxCodeOutput:
		maxOutput = MaxCodeOutput
	}
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	if req.TimeoutMs < 0 {
		return nil, &Error{Code: CodeInvalidArgument, Message: "negative timeout"}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := c.code()
	cs.mu.Lock()
	if cs.running[req.ID] != nil {
		cs.mu.Unlock()
		return nil, &Error{Code: CodeExists, Message: fmt.Sprintf("execution %q is already running", req.ID)}
	}
	cs.running[req.ID] = cancel
	cs.mu.Unlock()
	defer func() {
		cs.mu.Lock()
		delete(cs.running, req.ID)
		cs.mu.Unlock()
	}()
	s.onGone(cancel)

	cc, err := c.resolveCell(&req)
	if err != nil {
		return nil, err
	}
	em := &cellEmitter{s: s, cancel: cancel}
	res, err := cc.k.ExecuteWith(ctx, req.Code, interp.ExecuteOptions{Timeout: timeout, MaxOutput: maxOutput, Env: env}, em.emit)
	if res == nil {
		if err == nil {
			err = errors.New("the kernel returned no result")
		}
		if ctx.Err() != nil {
			return nil, errStreamGone
		}
		return nil, kernelErr(err)
	}
	out := CodeResult{ContextID: cc.info.ID, ExecutionCount: res.ExecutionCount,
		Truncated: res.Truncated, Restarted: res.Restarted}
	if res.Error != nil {
		out.Error = boundCellError(res.Error)
	}
	return out, nil
}

// boundCellError converts an interp error, bounding what goes in a final
// frame.
func boundCellError(e *interp.ExecError) *CellError {
	ce := &CellError{Name: e.Name, Value: e.Value}
	if len(ce.Name) > 1024 {
		ce.Name = ce.Name[:1024]
	}
	if len(ce.Value) > 64<<10 {
		ce.Value = ce.Value[:64<<10] + "..."
	}
	n := len(ce.Name) + len(ce.Value)
	for _, l := range e.Traceback {
		if n += len(l) + 8; n > maxTraceback {
			ce.Traceback = append(ce.Traceback, "... (traceback truncated)")
			break
		}
		ce.Traceback = append(ce.Traceback, l)
	}
	return ce
}

// cellEmitter sends a cell's outputs on its stream as they come.
type cellEmitter struct {
	s      *astream
	cancel context.CancelFunc
	gone   bool
}

func (e *cellEmitter) emit(o interp.Output) {
	if e.gone {
		return
	}
	var err error
	switch o.Type {
	case CodeEventStdout:
		err = e.s.sendData(FrameStdout, []byte(o.Text))
	case CodeEventStderr:
		err = e.s.sendData(FrameStderr, []byte(o.Text))
	case CodeEventResult:
		err = e.event(&CodeEvent{Type: CodeEventResult, Data: o.Data, Main: o.Main})
	case CodeEventError:
		if o.Error != nil {
			err = e.event(&CodeEvent{Type: CodeEventError, Error: boundCellError(o.Error)})
		}
	}
	if err != nil {
		e.gone = true
		e.cancel()
	}
}

func (e *cellEmitter) event(ev *CodeEvent) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encoding a code event: %w", err)
	}
	return e.s.sendData(FrameItems, append(b, '\n'))
}
