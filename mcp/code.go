package mcp

import (
	"context"
	"encoding/base64"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"airlock/manager"
)

// Interpreter runs code cells in persistent interpreter contexts inside a
// sandbox: variables, imports and the working directory of a language's
// context survive between cells.
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
	// Note is something the model should know, e.g. that the context was
	// restarted after a crash and lost its state.
	Note string
}

// CellError is an exception raised by a cell.
type CellError struct {
	Name, Value, Traceback string
}

// runCodeIn is the input of run_code.
type runCodeIn struct {
	Language       string  `json:"language" jsonschema:"Language of the code."`
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
		Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
		InputSchema: schema[runCodeIn](func(p map[string]*jsonschema.Schema) {
			p["language"].Enum = enum
			p["timeout_seconds"].Minimum, p["timeout_seconds"].Maximum = ptr(0.0), ptr(s.cfg.MaxCallTimeout.Seconds())
		}),
	}, s.runCode)
}

func (s *Service) runCode(ctx context.Context, req *sdk.CallToolRequest, in runCodeIn) (*sdk.CallToolResult, any, error) {
	timeout, err := s.callTimeout(in.TimeoutSeconds)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	sb, note, err := s.sandbox(ctx, req, in.SandboxID)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	start := time.Now()
	cell, err := s.cfg.Interpreter.Run(ctx, sb, in.Language, in.Code, timeout)
	detail := map[string]any{"via": "mcp", "language": in.Language, "code_bytes": len(in.Code),
		"duration_ms": time.Since(start).Milliseconds()}
	if err != nil {
		detail["error"] = err.Error()
	} else if cell.Error != nil {
		detail["exception"] = cell.Error.Name
	}
	s.m.Audit(ctx, sb.Owner(), sb.ID, "code.run", detail)
	if err != nil {
		return toolError(err, note), nil, nil
	}
	r := s.cellResult(cell)
	if cell.Note != "" {
		note = strings.TrimSpace(note + "\n" + cell.Note)
	}
	return withNote(r, note), nil, nil
}

// imageMIMEs are the result types shown as images, best first.
var imageMIMEs = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// cellResult maps a cell to content: stdout, stderr, each result (an
// image if it has one, else its text), and the error's traceback.
func (s *Service) cellResult(c *Cell) *sdk.CallToolResult {
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
	if c.Error != nil {
		tb := c.Error.Traceback
		if tb == "" {
			tb = c.Error.Name + ": " + c.Error.Value
		}
		text(capped("the traceback", tb))
	}
	if len(r.Content) == 0 {
		text("(no output)")
	}
	return r
}
