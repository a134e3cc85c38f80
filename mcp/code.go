package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/manager"
)

// Interpreter runs code cells in persistent interpreter contexts inside a
// sandbox: variables, imports and the working directory of a language's
// context survive between cells. AgentInterpreter, the kernels hosted by
// each sandbox's agent, is the one airlock uses; the interface lets tests
// and other runtimes supply their own.
type Interpreter interface {
	// Languages lists the languages Run accepts, e.g. "python".
	Languages() []string
	// Run runs code in sb's default context for language and returns
	// when the cell finished, failed or timed out. An error means the
	// cell could not be run at all; a failure of the code itself is
	// reported in Cell.Error.
	Run(ctx context.Context, sb *manager.Sandbox, language, code string, timeout time.Duration) (*Cell, error)
}

// Cell is the outcome of one code cell.
type Cell struct {
	// Stdout and Stderr are what the cell printed.
	Stdout, Stderr string
	// Results are rich outputs, in order: the last expression's value,
	// figures, tables. Each maps a MIME type to its data: text for text
	// types, base64 for images.
	Results []map[string]string
	// Error is the exception that ended the cell, if any.
	Error *CellError
	// ExecutionCount numbers the cells run in the context.
	ExecutionCount int
	// Truncated is set when output or results beyond the interpreter's
	// caps were dropped.
	Truncated bool
	// Note is something the model should know, e.g. that the context was
	// restarted after a crash and lost its state.
	Note string
}

// CellError is an exception raised by a cell.
type CellError struct {
	Name, Value, Traceback string
}

// AgentInterpreter runs cells in the code contexts hosted by a sandbox's
// agent (package interp's kernels): python, javascript and bash, one
// default context per language and sandbox.
type AgentInterpreter struct{}

// maxCellOutput is the stdout plus stderr a cell may send before the
// agent drops the rest; the result shows its head and tail.
const maxCellOutput = 4 << 20

// Languages implements Interpreter.
func (AgentInterpreter) Languages() []string { return []string{"python", "javascript", "bash"} }

// Run implements Interpreter. The agent stops the cell at timeout with a
// TimeoutError, keeping the context; if ctx ends first the cell is
// interrupted.
func (AgentInterpreter) Run(ctx context.Context, sb *manager.Sandbox, language, code string, timeout time.Duration) (*Cell, error) {
	cell, err := sb.Agent().RunCode(ctx, agent.CodeRequest{Language: language, Code: code, Timeout: timeout, MaxOutput: maxCellOutput})
	if err != nil {
		return nil, &startError{err}
	}
	defer cell.Close() // interrupts the cell if ctx ended first
	var out Cell
	var so, se strings.Builder
	for {
		select {
		case ev, ok := <-cell.Events():
			if !ok {
				end, err := cell.Wait(ctx)
				if err != nil {
					return nil, err
				}
				out.Stdout, out.Stderr = so.String(), se.String()
				out.ExecutionCount, out.Truncated = end.ExecutionCount, end.Truncated
				if out.Error == nil && end.Error != nil {
					out.Error = cellError(end.Error)
				}
				if end.Restarted {
					out.Note = "Note: the " + language + " interpreter had died (crash, exit or out of memory); this cell ran in a fresh one, so variables and imports from earlier cells are gone."
				}
				return &out, nil
			}
			switch ev.Type {
			case agent.CodeEventStdout:
				so.WriteString(ev.Text)
			case agent.CodeEventStderr:
				se.WriteString(ev.Text)
			case agent.CodeEventResult:
				out.Results = append(out.Results, ev.Data)
			case agent.CodeEventError:
				out.Error = cellError(ev.Error)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// startError is a failure to start a cell: nothing ran.
type startError struct{ err error }

func (e *startError) Error() string { return e.err.Error() }
func (e *startError) Unwrap() error { return e.err }

func cellError(e *agent.CellError) *CellError {
	if e == nil {
		return &CellError{Name: "Error"}
	}
	return &CellError{Name: e.Name, Value: e.Value, Traceback: strings.Join(e.Traceback, "\n")}
}

// runCodeIn is the input of run_code.
type runCodeIn struct {
	Language       string  `json:"language,omitempty" jsonschema:"Language of the code; default python."`
	Code           string  `json:"code" jsonschema:"The code to run, like a notebook cell."`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty" jsonschema:"Stop the cell after this many seconds (the context and its variables survive); 0 or absent means the server's default."`
	SandboxID      string  `json:"sandbox_id,omitempty" jsonschema:"Sandbox to use, as returned by create_sandbox. Omit it to use this session's own sandbox."`
}

func (s *Service) addRunCode() {
	langs := s.cfg.Interpreter.Languages()
	enum := make([]any, len(langs))
	for i, l := range langs {
		enum[i] = l
	}
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:  "run_code",
		Title: "Run code in a persistent interpreter",
		Description: "Run a cell of " + strings.Join(langs, ", ") + " code in a persistent interpreter inside the sandbox, like a Jupyter notebook: " +
			"variables, imports, functions and the working directory persist between calls of the same language in the same sandbox. " +
			"Returns what the code printed, the value of the last expression, and every matplotlib figure shown or left open as a PNG image. " +
			"An exception makes the result an error carrying the traceback. " +
			"The code runs in /workspace; Python has numpy, pandas and matplotlib when the host has them. " + s.networkText() + " " +
			fmt.Sprintf("A cell is stopped after timeout_seconds (default %g s, at most %g s); the interpreter's state survives. ", s.cfg.CallTimeout.Seconds(), s.cfg.MaxCallTimeout.Seconds()) +
			"Files written here are visible to run_command, read_file and list_files.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(s.openWorld())},
		InputSchema: schema[runCodeIn](func(p map[string]*jsonschema.Schema) {
			p["language"].Enum = enum
			p["language"].Default = json.RawMessage(`"python"`)
			p["timeout_seconds"].Minimum, p["timeout_seconds"].Maximum = ptr(0.0), ptr(s.cfg.MaxCallTimeout.Seconds())
		}),
	}, s.runCode)
}

func (s *Service) runCode(ctx context.Context, req *sdk.CallToolRequest, in runCodeIn) (*sdk.CallToolResult, any, error) {
	if in.Language == "" {
		in.Language = "python" // the HTTP API's default too
	}
	timeout, err := s.callTimeout(in.TimeoutSeconds)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	sb, note, err := s.sandbox(ctx, req, in.SandboxID)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	sum := sha256.Sum256([]byte(in.Code))
	intent := map[string]any{"via": "mcp", "language": in.Language, "code_bytes": len(in.Code), "code_sha256": hex.EncodeToString(sum[:])}
	if err := s.auditFirst(ctx, sb, "code.run", intent); err != nil {
		return toolError(err, note), nil, nil
	}
	start := time.Now()
	cell, err := s.cfg.Interpreter.Run(ctx, sb, in.Language, in.Code, timeout)
	var notStarted *startError
	if err != nil && in.SandboxID == "" && errors.As(err, &notStarted) && errors.Is(err, agent.ErrClosed) {
		// The session's sandbox died before the cell started (see
		// runCommand): nothing ran, so run it in a fresh one.
		if sb2, note2, err2 := s.sandbox(ctx, req, ""); err2 == nil && sb2 != sb {
			note = strings.TrimSpace(note + "\n" + note2)
			sb = sb2
			if err := s.auditFirst(ctx, sb, "code.run", intent); err != nil {
				return toolError(err, note), nil, nil
			}
			cell, err = s.cfg.Interpreter.Run(ctx, sb, in.Language, in.Code, timeout)
		}
	}
	detail := map[string]any{"via": "mcp", "language": in.Language, "code_bytes": len(in.Code),
		"duration_ms": time.Since(start).Milliseconds()}
	if err != nil {
		detail["error"] = err.Error()
	} else if cell.Error != nil {
		detail["exception"] = cell.Error.Name
	}
	s.m.Audit(ctx, sb.Owner(), sb.ID, "code.run.result", detail)
	if err != nil {
		return toolError(err, note), nil, nil
	}
	if cell.Note != "" {
		note = strings.TrimSpace(note + "\n" + cell.Note)
	}
	restarted := ""
	if cell.Error != nil {
		// A failed cell may have forked processes that outlive it (they
		// belong to the interpreter's process group); if they filled the
		// sandbox, free it now rather than fail the next call.
		if restarted = s.unjam(ctx, sb); restarted != "" {
			note = strings.TrimSpace(note + "\n" + restarted)
		}
	}
	return withNote(s.cellResult(cell, restarted == ""), note), nil, nil
}

// imageMIMEs are the result types shown as images, best first.
var imageMIMEs = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// cellResult maps a cell to content: stdout, stderr, each result (an
// image if it has one, else its text), and the error's traceback. kept
// says whether the interpreter still holds its state.
func (s *Service) cellResult(c *Cell, kept bool) *sdk.CallToolResult {
	r := &sdk.CallToolResult{IsError: c.Error != nil}
	text := func(t string) {
		if t != "" {
			r.Content = append(r.Content, &sdk.TextContent{Text: t})
		}
	}
	capped := func(name, t string) string {
		cp := newCapture(s.cfg.MaxOutput)
		cp.Write([]byte(t))
		return cp.Text(name)
	}
	text(capped("stdout", c.Stdout))
	if c.Stderr != "" {
		text("stderr:\n" + capped("stderr", c.Stderr))
	}
	for _, bundle := range c.Results {
		shown := false
		for _, mt := range imageMIMEs {
			if data, ok := bundle[mt]; ok {
				if b, err := base64.StdEncoding.DecodeString(data); err == nil {
					r.Content = append(r.Content, &sdk.ImageContent{Data: b, MIMEType: mt})
					shown = true
					break
				}
			}
		}
		if shown {
			continue
		}
		if t, ok := bundle["text/plain"]; ok {
			text(capped("the result", t))
			continue
		}
		// No image, no plain text: show the first textual type.
		types := make([]string, 0, len(bundle))
		for mt := range bundle {
			types = append(types, mt)
		}
		sort.Strings(types)
		for _, mt := range types {
			if strings.HasPrefix(mt, "text/") || mt == "application/json" || strings.HasSuffix(mt, "+xml") {
				text(mt + ":\n" + capped("the result", bundle[mt]))
				break
			}
		}
	}
	if c.Truncated {
		text(fmt.Sprintf("[... the interpreter dropped output beyond %s, or a result too large to return ...]", sizeText(maxCellOutput)))
	}
	if c.Error != nil {
		tb := strings.TrimRight(c.Error.Traceback, "\n")
		head := c.Error.Name
		if c.Error.Value != "" {
			head += ": " + c.Error.Value
		}
		// The error itself, unless the traceback's last line says it.
		if lines := strings.Split(tb, "\n"); !strings.HasPrefix(lines[len(lines)-1], c.Error.Name) {
			tb = strings.TrimLeft(tb+"\n"+head, "\n")
		}
		if kept && (c.Error.Name == "TimeoutError" || c.Error.Name == "KeyboardInterrupt") {
			tb += "\n(the interpreter and its variables are kept)"
		}
		text(capped("the traceback", tb))
	}
	if len(r.Content) == 0 {
		text("(no output)")
	}
	return r
}

// jammed reports whether sb cannot start a process (its process or memory
// limit is exhausted).
func jammed(ctx context.Context, sb *manager.Sandbox) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := sb.Agent().Exec(ctx, agent.ExecRequest{Argv: []string{"true"}, Tag: "mcp-probe"})
	if err != nil {
		return isEAGAIN(err)
	}
	defer p.Close()
	p.Wait(ctx)
	return false
}

// isEAGAIN reports whether the agent could not fork.
func isEAGAIN(err error) bool {
	var ae *agent.Error
	return errors.As(err, &ae) && strings.Contains(ae.Message, syscall.EAGAIN.Error())
}

// unjam restarts sb's code contexts if sb cannot start a process: their
// kernels' process groups hold whatever runaway cells forked. It returns
// a note for the model, or "" if nothing was done.
func (s *Service) unjam(ctx context.Context, sb *manager.Sandbox) string {
	if !jammed(ctx, sb) {
		return ""
	}
	c := sb.Agent()
	list, err := c.Contexts(ctx)
	if err != nil || len(list) == 0 {
		return ""
	}
	var langs []string
	for _, cx := range list {
		if err := c.RestartContext(ctx, cx.ID); err != nil {
			s.cfg.Logf("mcp: sandbox %s: restart context %s: %v", sb.ID, cx.ID, err)
			continue
		}
		langs = append(langs, cx.Language)
	}
	if len(langs) == 0 {
		return ""
	}
	s.m.Audit(ctx, sb.Owner(), sb.ID, "code.restart", map[string]any{"via": "mcp", "reason": "process limit exhausted"})
	return "Note: processes left running by code cells had exhausted the sandbox's process limit; the " + strings.Join(langs, ", ") +
		" interpreter(s) were restarted to free it, so their variables and imports are gone."
}
