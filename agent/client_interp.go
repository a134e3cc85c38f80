package agent

// Code interpreter requests (frame types 0x30-0x3f).
//
// A sandbox holds code contexts: persistent Python, JavaScript or bash
// kernels (package interp) hosted by the agent, whose variables, imports,
// functions and working directory survive between cells. Contexts outlive a
// host connection, as background processes do; each language has a default
// context, created by the first cell that names only the language, whose id
// is the language's name.
//
// A RunCode stream carries, in the order the cell produced them: Stdout and
// Stderr frames with the cell's output (raw bytes, at most the request's
// output cap in all), and Items frames whose concatenated payloads are
// newline-delimited JSON code events (results as MIME bundles, and the error
// that ended the cell). It ends with a Result (codeResultMsg) or an Error
// when the cell could not run. A cell whose stream the host resets is
// interrupted, as is one named by an InterruptCode request.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/airlock-dev/airlock/interp/lang"
)

// Interpreter frame types.
const (
	// FrameCreateContext starts a code context; Result is a ContextInfo.
	FrameCreateContext FrameType = 0x30
	// FrameContexts lists the code contexts; Result is a contextsMsg.
	FrameContexts FrameType = 0x31
	// FrameRestartContext restarts a context's kernel, losing its state.
	FrameRestartContext FrameType = 0x32
	// FrameDeleteContext stops a context and forgets it.
	FrameDeleteContext FrameType = 0x33
	// FrameRunCode runs a cell; the stream carries its output and events.
	FrameRunCode FrameType = 0x34
	// FrameInterruptCode interrupts a running (or queued) cell by id.
	FrameInterruptCode FrameType = 0x35
)

func init() {
	frameNames[FrameCreateContext] = "create_context"
	frameNames[FrameContexts] = "contexts"
	frameNames[FrameRestartContext] = "restart_context"
	frameNames[FrameDeleteContext] = "delete_context"
	frameNames[FrameRunCode] = "run_code"
	frameNames[FrameInterruptCode] = "interrupt_code"
}

// Interpreter limits.
const (
	// MaxContexts bounds the code contexts of one sandbox.
	MaxContexts = 32
	// DefaultCodeOutput is a cell's stdout plus stderr cap when the
	// request gives none.
	DefaultCodeOutput = 1 << 20
	// MaxCodeOutput is the largest output cap a request may ask for.
	MaxCodeOutput = 64 << 20
	// MaxCodeResult bounds one rich result (a MIME bundle, base64 images
	// included) and the results of one cell together.
	MaxCodeResult = 16 << 20
	// maxCodeEvent bounds one JSON event line the client accepts.
	maxCodeEvent = MaxCodeResult + 1<<20
	// maxTraceback bounds the traceback carried by the final frame.
	maxTraceback = 256 << 10
)

// Code event types.
const (
	CodeEventStdout = "stdout"
	CodeEventStderr = "stderr"
	CodeEventResult = "result"
	CodeEventError  = "error"
)

// ContextInfo describes a code context.
type ContextInfo struct {
	// ID names the context; a default context's id is its language.
	ID string `json:"id"`
	// Language is python, javascript or bash.
	Language string `json:"language"`
	// Cwd is the absolute directory the kernel started in.
	Cwd string `json:"cwd"`
}

// ContextRequest describes a context to create.
type ContextRequest struct {
	// Language is python, javascript or bash.
	Language string `json:"language"`
	// Cwd is the kernel's working directory, relative to the agent's
	// home, which is also the default.
	Cwd string `json:"cwd,omitempty"`
	// Env is KEY=VALUE pairs added to the sandbox's base environment.
	Env []string `json:"env,omitempty"`
}

// CellError is the error that ended a cell: an exception (Name is its
// class), KeyboardInterrupt, TimeoutError, KernelDied, ExitStatus (bash).
type CellError struct {
	Name      string   `json:"name"`
	Value     string   `json:"value"`
	Traceback []string `json:"traceback,omitempty"`
}

// Error implements error.
func (e *CellError) Error() string {
	if e.Value == "" {
		return e.Name
	}
	return e.Name + ": " + e.Value
}

// CodeEvent is one output of a cell.
type CodeEvent struct {
	// Type is CodeEventStdout, CodeEventStderr, CodeEventResult or CodeEventError.
	Type string `json:"type"`
	// Text is stdout or stderr text (possibly a piece of a UTF-8
	// sequence at chunk boundaries).
	Text string `json:"text,omitempty"`
	// Data is a result's MIME bundle: text types as text, binary types
	// base64, JSON types JSON text.
	Data map[string]string `json:"data,omitempty"`
	// Main marks the result that is the value of the cell's last
	// expression, as opposed to figures and display() calls.
	Main bool `json:"main,omitempty"`
	// Error is set for CodeEventError.
	Error *CellError `json:"error,omitempty"`
}

// CodeRequest is a cell to run.
type CodeRequest struct {
	// ID names the execution for InterruptCode; empty means a random
	// one. At most 64 letters, digits, '-' and '_'.
	ID string
	// Code is the cell's source; the request must fit a frame
	// (MaxFrameSize).
	Code string
	// ContextID names the context; empty means the default context of
	// Language.
	ContextID string
	// Language is python (the default), javascript or bash; used when
	// ContextID is empty. With ContextID, a context of another language
	// is refused (CodeInvalidArgument): the host gated that language.
	Language string
	// Timeout stops the cell (TimeoutError) after this long; 0 means
	// none.
	Timeout time.Duration
	// MaxOutput caps stdout plus stderr in bytes (beyond it output is
	// dropped and Truncated set); 0 means DefaultCodeOutput.
	MaxOutput int
	// Env is KEY=VALUE pairs set for this cell only (the kernel's
	// environment and the processes the cell starts); the previous values
	// are back afterwards.
	Env []string
	// Cwd is the working directory of the default context this cell
	// starts, if it starts one (relative to the agent's home, which is
	// also the default); a context already running keeps its own.
	Cwd string
}

// CodeResult is how a cell ended.
type CodeResult struct {
	// ContextID is the context the cell ran in.
	ContextID string `json:"context_id"`
	// ExecutionCount numbers the cells run by the context's current
	// kernel, from 1.
	ExecutionCount int `json:"execution_count"`
	// Error is why the cell failed, or nil.
	Error *CellError `json:"error,omitempty"`
	// Truncated is set when output beyond the cap, or a result beyond
	// MaxCodeResult, was dropped.
	Truncated bool `json:"truncated,omitempty"`
	// Restarted is set when the previous kernel died and this cell ran in
	// a fresh one (its state is gone).
	Restarted bool `json:"restarted,omitempty"`
}

// Wire messages of the interpreter requests.
type (
	contextIDMsg struct {
		ID string `json:"id"`
	}
	contextsMsg struct {
		Contexts []ContextInfo `json:"contexts"`
	}
	runCodeMsg struct {
		ID        string   `json:"id"`
		Code      string   `json:"code"`
		ContextID string   `json:"context_id,omitempty"`
		Language  string   `json:"language,omitempty"`
		TimeoutMs int64    `json:"timeout_ms,omitempty"`
		MaxOutput int      `json:"max_output,omitempty"`
		Env       []string `json:"env,omitempty"`
		Cwd       string   `json:"cwd,omitempty"`
	}
)

// validExecID reports whether id is an acceptable execution id.
func validExecID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// NewExecID returns a random execution id.
func NewExecID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// CreateContext starts a code context and waits until its kernel is ready.
func (c *Client) CreateContext(ctx context.Context, req ContextRequest) (ContextInfo, error) {
	var info ContextInfo
	err := c.call(ctx, FrameCreateContext, req, &info)
	return info, err
}

// Contexts lists the sandbox's code contexts.
func (c *Client) Contexts(ctx context.Context) ([]ContextInfo, error) {
	var m contextsMsg
	if err := c.call(ctx, FrameContexts, emptyMsg{}, &m); err != nil {
		return nil, err
	}
	return m.Contexts, nil
}

// CellLanguage is the language a cell of req would run: its context's when
// it names one (an error of code CodeNotFound without such a context),
// else its Language, canonical when the agent knows it. A context keeps
// its language for life and its id is never reused for another, so an
// approval gate decides on what will really run; RunCode, given this
// language with the context, also refuses a context of another one.
func (c *Client) CellLanguage(ctx context.Context, req CodeRequest) (string, error) {
	if req.ContextID == "" {
		if l, ok := lang.Canonical(req.Language); ok {
			return l, nil
		}
		return req.Language, nil
	}
	list, err := c.Contexts(ctx)
	if err != nil {
		return "", err
	}
	for _, cx := range list {
		if cx.ID == req.ContextID {
			return cx.Language, nil
		}
	}
	return "", &Error{Code: CodeNotFound, Message: fmt.Sprintf("no code context %q", req.ContextID)}
}

// RestartContext replaces a context's kernel with a fresh one, keeping its
// id, language and cwd. A running cell ends with an error.
func (c *Client) RestartContext(ctx context.Context, id string) error {
	return c.call(ctx, FrameRestartContext, contextIDMsg{ID: id}, nil)
}

// DeleteContext stops a context's kernel and forgets the context.
func (c *Client) DeleteContext(ctx context.Context, id string) error {
	return c.call(ctx, FrameDeleteContext, contextIDMsg{ID: id}, nil)
}

// InterruptCode interrupts the cell with execution id id, running or
// waiting for its context: it ends with KeyboardInterrupt and the context
// keeps its state. An unknown id is CodeNotFound.
func (c *Client) InterruptCode(ctx context.Context, id string) error {
	return c.call(ctx, FrameInterruptCode, contextIDMsg{ID: id}, nil)
}

// Cell is a running cell. Its outputs arrive as Events; Wait consumes the
// same events, so use Events (then Wait for the result) or Wait alone. The
// consumer must keep reading or Close the Cell, which interrupts the cell.
type Cell struct {
	// ID is the execution id.
	ID string

	s      *cstream
	ctx    context.Context
	cancel context.CancelFunc
	events chan CodeEvent
	// Set by the pump before events is closed.
	res *CodeResult
	err error
}

// RunCode starts a cell. ctx bounds only the start: use the request's
// Timeout, InterruptCode or Close to stop the cell.
func (c *Client) RunCode(ctx context.Context, req CodeRequest) (*Cell, error) {
	if req.ID == "" {
		req.ID = NewExecID()
	}
	if !validExecID(req.ID) {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("bad execution id %q", req.ID)}
	}
	m := runCodeMsg{ID: req.ID, Code: req.Code, ContextID: req.ContextID, Language: req.Language,
		TimeoutMs: req.Timeout.Milliseconds(), MaxOutput: req.MaxOutput, Env: req.Env, Cwd: req.Cwd}
	if req.Timeout > 0 && m.TimeoutMs == 0 {
		m.TimeoutMs = 1
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s, err := c.open(FrameRunCode, m)
	if err != nil {
		return nil, fmt.Errorf("agent run_code: %w", err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	cell := &Cell{ID: req.ID, s: s, ctx: cctx, cancel: cancel, events: make(chan CodeEvent, 8)}
	go cell.pump()
	return cell, nil
}

// pump turns the stream's frames into events.
func (cl *Cell) pump() {
	defer close(cl.events)
	var line []byte
	send := func(ev CodeEvent) bool {
		select {
		case cl.events <- ev:
			return true
		case <-cl.ctx.Done():
			cl.err = ErrDetached
			return false
		}
	}
	for {
		f, err := cl.s.next(cl.ctx)
		if err != nil {
			if cl.ctx.Err() != nil {
				err = ErrDetached
			}
			cl.err = err
			return
		}
		switch f.Type {
		case FrameStdout, FrameStderr:
			ev := CodeEvent{Type: CodeEventStdout, Text: string(f.Payload)}
			if f.Type == FrameStderr {
				ev.Type = CodeEventStderr
			}
			if !send(ev) {
				return
			}
			cl.s.consumed(len(f.Payload))
		case FrameItems:
			p := f.Payload
			for len(p) > 0 {
				i := bytes.IndexByte(p, '\n')
				if i < 0 {
					line = append(line, p...)
					p = nil
					break
				}
				line = append(line, p[:i]...)
				p = p[i+1:]
				var ev CodeEvent
				if err := decodeJSON(line, &ev); err != nil {
					cl.err = protoErr("bad code event: %v", err)
					cl.s.reset()
					return
				}
				line = line[:0]
				if cap(line) > 1<<20 {
					line = nil
				}
				if !send(ev) {
					return
				}
			}
			if len(line) > maxCodeEvent {
				cl.err = protoErr("code event longer than %d bytes", maxCodeEvent)
				cl.s.reset()
				return
			}
			cl.s.consumed(len(f.Payload))
		case FrameResult:
			var r CodeResult
			if err := decodeJSON(f.Payload, &r); err != nil {
				cl.err = protoErr("bad code result: %v", err)
				return
			}
			cl.res = &r
			return
		case FrameError:
			cl.err = decodeError(f.Payload)
			return
		default:
			cl.err = protoErr("unexpected %s frame on a run_code stream", f.Type)
			cl.s.reset()
			return
		}
	}
}

// Events returns the cell's outputs; the channel is closed when the cell
// has ended (then Wait returns at once), or early if the connection fails
// or the Cell is closed.
func (cl *Cell) Events() <-chan CodeEvent { return cl.events }

// Wait discards the remaining events until the cell ends and returns how it
// ended. If ctx ends first it returns ctx's error; the cell keeps running.
func (cl *Cell) Wait(ctx context.Context) (CodeResult, error) {
	for {
		select {
		case _, ok := <-cl.events:
			if !ok {
				if cl.res != nil {
					return *cl.res, nil
				}
				if cl.err == nil {
					return CodeResult{}, ErrDetached
				}
				return CodeResult{}, cl.err
			}
		case <-ctx.Done():
			return CodeResult{}, ctx.Err()
		}
	}
}

// Close abandons the cell, interrupting it if it is still running. Close is
// idempotent.
func (cl *Cell) Close() error {
	cl.cancel()
	cl.s.reset()
	return nil
}

// Collected is a cell's outputs gathered by Collect.
type Collected struct {
	CodeResult
	// Stdout and Stderr are the cell's output, up to the cap given to
	// Collect.
	Stdout, Stderr string
	// Results are the MIME bundles in order.
	Results []CodeEvent
}

// Collect runs the rest of the cell, gathering stdout and stderr (each up
// to maxBytes; more sets Truncated) and its results. If ctx ends first the
// cell is interrupted (Close) and ctx's error returned with what was
// gathered.
func (cl *Cell) Collect(ctx context.Context, maxBytes int) (Collected, error) {
	var out Collected
	var so, se []byte
	add := func(dst []byte, s string) []byte {
		if room := maxBytes - len(dst); len(s) > room {
			out.Truncated = true
			s = s[:max(room, 0)]
		}
		return append(dst, s...)
	}
	var errEv *CellError
	for {
		select {
		case ev, ok := <-cl.events:
			if !ok {
				out.Stdout, out.Stderr = string(so), string(se)
				if cl.res == nil {
					err := cl.err
					if err == nil {
						err = ErrDetached
					}
					return out, err
				}
				tr := out.Truncated
				out.CodeResult = *cl.res
				out.Truncated = out.Truncated || tr
				if out.Error == nil {
					out.Error = errEv
				}
				return out, nil
			}
			switch ev.Type {
			case CodeEventStdout:
				so = add(so, ev.Text)
			case CodeEventStderr:
				se = add(se, ev.Text)
			case CodeEventResult:
				out.Results = append(out.Results, ev)
			case CodeEventError:
				errEv = ev.Error
			}
		case <-ctx.Done():
			cl.Close()
			out.Stdout, out.Stderr = string(so), string(se)
			return out, ctx.Err()
		}
	}
}
