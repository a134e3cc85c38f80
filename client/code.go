package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
)

// CodeContext is a persistent interpreter context inside a sandbox.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// ContextRequest describes a context to create.
type ContextRequest struct {
	// Language is python (default), javascript or bash.
	Language string `json:"language,omitempty"`
	// Cwd is the kernel's working directory (default /workspace).
	Cwd string `json:"cwd,omitempty"`
	// Env is added to the sandbox's environment for the kernel.
	Env map[string]string `json:"env,omitempty"`
}

// CodeRequest is a cell to run.
type CodeRequest struct {
	// Code is the cell's source.
	Code string `json:"code"`
	// Language picks the language's default context when ContextID is
	// empty: python (default), javascript or bash.
	Language string `json:"language,omitempty"`
	// ContextID names a context made with CreateContext.
	ContextID string `json:"context_id,omitempty"`
	// Timeout interrupts the cell (TimeoutError); 0 means the server's
	// default (60 s).
	Timeout time.Duration `json:"-"`
	// MaxOutput caps stdout plus stderr in bytes; 0 means 1 MiB.
	MaxOutput int `json:"max_output,omitempty"`
	// Env sets environment variables for this cell only.
	Env map[string]string `json:"env,omitempty"`
}

func (r CodeRequest) wire() (any, error) {
	if _, err := wireSeconds("Timeout", r.Timeout, 0); err != nil {
		return nil, err
	}
	return struct {
		CodeRequest
		Timeout float64 `json:"timeout,omitempty"`
	}{r, r.Timeout.Seconds()}, nil
}

// CodeError is the error that ended a cell: an exception (Name is its
// class), KeyboardInterrupt, TimeoutError, KernelDied...
type CodeError struct {
	Name      string   `json:"name"`
	Value     string   `json:"value"`
	Traceback []string `json:"traceback"`
}

// Error implements error.
func (e *CodeError) Error() string { return e.Name + ": " + e.Value }

// CodeResult is the outcome of a cell.
type CodeResult struct {
	ExecutionID    string `json:"execution_id"`
	ContextID      string `json:"context_id"`
	ExecutionCount int    `json:"execution_count"`
	Stdout         string `json:"stdout"`
	Stderr         string `json:"stderr"`
	// Results are MIME bundles: text/plain, text/html, image/png
	// (base64), application/json...
	Results []map[string]string `json:"results"`
	// Text is the text/plain of the main result (the last expression).
	Text       string     `json:"text,omitempty"`
	Error      *CodeError `json:"error,omitempty"`
	Truncated  bool       `json:"truncated"`
	Restarted  bool       `json:"restarted"`
	DurationMS float64    `json:"duration_ms"`
	// Status is "oom" when the out-of-memory killer ended the cell's kernel.
	Status string `json:"status,omitempty"`
}

// CreateContext starts a persistent interpreter context.
func (c *Client) CreateContext(ctx context.Context, id string, req ContextRequest) (*CodeContext, error) {
	var out CodeContext
	if err := c.call(ctx, "POST", sbPath(id, "/contexts"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Contexts lists a sandbox's contexts.
func (c *Client) Contexts(ctx context.Context, id string) ([]CodeContext, error) {
	var out struct {
		Contexts []CodeContext `json:"contexts"`
	}
	if err := c.call(ctx, "GET", sbPath(id, "/contexts"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Contexts, nil
}

// RestartContext restarts a context's interpreter, losing its state.
func (c *Client) RestartContext(ctx context.Context, id, contextID string) error {
	return c.call(ctx, "POST", sbPath(id, "/contexts/", url.PathEscape(contextID), "/restart"), nil, struct{}{}, nil)
}

// DeleteContext stops a context.
func (c *Client) DeleteContext(ctx context.Context, id, contextID string) error {
	return c.call(ctx, "DELETE", sbPath(id, "/contexts/", url.PathEscape(contextID)), nil, nil, nil)
}

// RunCode runs a cell and returns its whole result.
func (c *Client) RunCode(ctx context.Context, id string, req CodeRequest) (*CodeResult, error) {
	var out CodeResult
	in, err := req.wire()
	if err != nil {
		return nil, err
	}
	if err := c.call(ctx, "POST", sbPath(id, "/code"), nil, in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// InterruptCode interrupts a running cell by its execution id (the start
// event of RunCodeStream carries it).
func (c *Client) InterruptCode(ctx context.Context, id, executionID string) error {
	return c.call(ctx, "DELETE", sbPath(id, "/code/", url.PathEscape(executionID)), nil, nil, nil)
}

// CodeEvent is one event of a streamed cell.
type CodeEvent struct {
	// Type is "start", "stdout", "stderr", "result", "error" or "end".
	Type string
	// ExecutionID is set on start and end events.
	ExecutionID string
	// Text is the output of stdout and stderr events.
	Text string
	// Data is a result's MIME bundle; Main marks the last expression's.
	Data map[string]string
	Main bool
	// Error is set on error events, and on the end event of a failed cell.
	Error *CodeError
	// End holds the outcome on the end event (without outputs).
	End *CodeResult
}

// CodeStream is a streamed cell.
type CodeStream struct {
	body io.ReadCloser
	br   *bufio.Reader
}

// maxCodeEventLine bounds one SSE data line of a code stream.
const maxCodeEventLine = 32 << 20

// RunCodeStream runs a cell and streams its events. Closing the stream
// before the end interrupts the cell.
func (c *Client) RunCodeStream(ctx context.Context, id string, req CodeRequest) (*CodeStream, error) {
	in, err := req.wire()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("airlock: encode request: %w", err)
	}
	hreq, err := c.newRequest(ctx, "POST", sbPath(id, "/code"), nil, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Accept", "text/event-stream")
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.do(hreq)
	if err != nil {
		return nil, err
	}
	return &CodeStream{body: resp.Body, br: bufio.NewReaderSize(resp.Body, 64<<10)}, nil
}

// readLine reads one line, bounded by maxCodeEventLine.
func (s *CodeStream) readLine() (string, error) {
	var line []byte
	for {
		frag, err := s.br.ReadSlice('\n')
		line = append(line, frag...)
		if len(line) > maxCodeEventLine {
			return "", fmt.Errorf("airlock: code event longer than %d bytes", maxCodeEventLine)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return "", err
		}
		return strings.TrimRight(string(line), "\r\n"), nil
	}
}

// Next returns the next event, or io.EOF after the last.
func (s *CodeStream) Next() (CodeEvent, error) {
	var typ, data string
	for {
		line, err := s.readLine()
		if err == io.EOF {
			return CodeEvent{}, io.EOF
		}
		if err != nil {
			return CodeEvent{}, fmt.Errorf("airlock: read code stream: %w", err)
		}
		switch {
		case line == "":
			if typ == "" {
				continue
			}
			return parseCodeEvent(typ, []byte(data))
		case strings.HasPrefix(line, "event: "):
			typ = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data += line[len("data: "):]
		}
	}
}

func parseCodeEvent(typ string, data []byte) (CodeEvent, error) {
	ev := CodeEvent{Type: typ}
	bad := func(err error) (CodeEvent, error) {
		return CodeEvent{}, fmt.Errorf("airlock: bad %s event: %w", typ, err)
	}
	switch typ {
	case "stdout", "stderr":
		var raw struct {
			Data    string `json:"data"`
			DataB64 string `json:"data_b64"`
		}
		if err := json.Unmarshal(data, &raw); err != nil {
			return bad(err)
		}
		ev.Text = raw.Data
		if raw.DataB64 != "" {
			b, err := base64.StdEncoding.DecodeString(raw.DataB64)
			if err != nil {
				return bad(err)
			}
			ev.Text = string(b)
		}
	case "result":
		var raw struct {
			Data map[string]string `json:"data"`
			Main bool              `json:"main"`
		}
		if err := json.Unmarshal(data, &raw); err != nil {
			return bad(err)
		}
		ev.Data, ev.Main = raw.Data, raw.Main
	case "error":
		var e CodeError
		if err := json.Unmarshal(data, &e); err != nil {
			return bad(err)
		}
		ev.Error = &e
	case "start", "end":
		var r CodeResult
		if err := json.Unmarshal(data, &r); err != nil {
			return bad(err)
		}
		ev.ExecutionID, ev.Error = r.ExecutionID, r.Error
		if typ == "end" {
			ev.End = &r
		}
	}
	return ev, nil
}

// Close ends the stream; a cell still running is interrupted.
func (s *CodeStream) Close() error { return s.body.Close() }
