package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/store"
)

func ptr[T any](v T) *T { return &v }

// schema infers the input schema of T and lets tweak refine its
// properties (ranges, enums, defaults).
func schema[T any](tweak func(p map[string]*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp: schema of %T: %v", *new(T), err))
	}
	if tweak != nil {
		tweak(s.Properties)
	}
	return s
}

func (s *Service) addTools() {
	maxCall := s.cfg.MaxCallTimeout.Seconds()
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:  "run_command",
		Title: "Run a shell command in the sandbox",
		Description: "Run a command in an isolated Linux sandbox and return its stdout and stderr. " +
			"Give `command` (a shell command line run by /bin/sh -c, so pipes, redirections, && and ; work) or `argv` (a program and its arguments, no shell). " +
			"It runs in /workspace as an unprivileged user, with the host's tools only (sh, bash, coreutils, python3 with numpy/pandas/matplotlib if installed on the host). " +
			s.networkText() + " " +
			"Files written under /workspace stay for later calls on the same sandbox. " +
			fmt.Sprintf("The call is stopped after timeout_seconds (default %g s, at most %g s). ", s.cfg.CallTimeout.Seconds(), maxCall) +
			"Processes the command leaves running in the background are killed when it returns. " +
			fmt.Sprintf("Output beyond %s per stream is cut from the middle, with a note. ", sizeText(int64(s.cfg.MaxOutput))) +
			"A non-zero exit code, a signal or a timeout makes the result an error carrying the output.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(s.openWorld())},
		InputSchema: schema[runCommandIn](func(p map[string]*jsonschema.Schema) {
			p["timeout_seconds"].Minimum, p["timeout_seconds"].Maximum = ptr(0.0), ptr(maxCall)
			p["argv"].MinItems = ptr(1)
		}),
	}, s.runCommand)

	sdk.AddTool(s.srv, &sdk.Tool{
		Name:  "write_file",
		Title: "Write a file in the sandbox",
		Description: "Create or overwrite a file inside the sandbox, creating missing parent directories. " +
			"Relative paths are relative to /workspace (the working directory of run_command and run_code); /tmp is writable too. " +
			"Give the content as text, or as base64 with encoding=\"base64\" for binary files. " +
			fmt.Sprintf("At most %s; the sandbox's disk is limited too.", sizeText(int64(s.cfg.MaxWrite))),
		Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
		InputSchema: schema[writeFileIn](func(p map[string]*jsonschema.Schema) {
			p["encoding"].Enum = []any{"utf-8", "base64"}
			p["path"].MinLength = ptr(1)
		}),
	}, s.writeFile)

	sdk.AddTool(s.srv, &sdk.Tool{
		Name:  "read_file",
		Title: "Read a file from the sandbox",
		Description: "Read a file from inside the sandbox. Text files come back as text " +
			fmt.Sprintf("(at most %s; longer files are truncated with a note: use run_command with head, tail, sed or grep for other parts), ", sizeText(int64(s.cfg.MaxReadText))) +
			fmt.Sprintf("PNG, JPEG, GIF and WebP images as images (up to %s). Other binary files are described, not shown. ", sizeText(int64(s.cfg.MaxReadImage))) +
			"Relative paths are relative to /workspace.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
		InputSchema: schema[readFileIn](func(p map[string]*jsonschema.Schema) {
			p["path"].MinLength = ptr(1)
		}),
	}, s.readFile)

	sdk.AddTool(s.srv, &sdk.Tool{
		Name:  "list_files",
		Title: "List files in the sandbox",
		Description: "List a directory inside the sandbox (default /workspace), `depth` levels deep (default 1, at most 5), " +
			"one entry per line: type (d directory, f file, l symlink, o other), size in bytes, path relative to the listed directory.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
		InputSchema: schema[listFilesIn](func(p map[string]*jsonschema.Schema) {
			p["depth"].Minimum, p["depth"].Maximum = ptr(1.0), ptr(5.0)
		}),
	}, s.listFiles)

	sdk.AddTool(s.srv, &sdk.Tool{
		Name:  "create_sandbox",
		Title: "Create a sandbox",
		Description: "Create an additional, independent sandbox and return its sandbox_id, to pass to the other tools. " +
			"You rarely need this: without sandbox_id every tool uses this session's own sandbox. Use it to keep separate environments apart or to get another profile. " +
			"Profiles: strict (default: 512 MiB memory, 1 CPU, 128 processes, 256 MiB disk), standard (2 GiB, 2 CPUs, 512 processes, 1 GiB disk), light (4 GiB, 2 CPUs, 1024 processes, 4 GiB disk, more system calls allowed); " +
			"the server's operator may have set other defaults. " +
			s.createNetworkText() +
			"The sandbox lives until timeout_seconds pass or kill_sandbox; it is not destroyed when the session ends.",
		Annotations: &sdk.ToolAnnotations{OpenWorldHint: ptr(false)},
		InputSchema: schema[createIn](func(p map[string]*jsonschema.Schema) {
			p["profile"].Enum = []any{"strict", "standard", "light"}
			p["network"].Enum = []any{"none"}
			if s.cfg.Network.Mode != policy.NetNone {
				p["network"].Enum = []any{"none", "default"}
			}
			p["timeout_seconds"].Minimum, p["timeout_seconds"].Maximum = ptr(1.0), ptr(86400.0)
			p["memory_mb"].Minimum = ptr(16.0)
			p["pids"].Minimum = ptr(4.0)
			p["cpus"].Minimum = ptr(0.01)
		}),
	}, s.createSandbox)

	sdk.AddTool(s.srv, &sdk.Tool{
		Name:        "list_sandboxes",
		Title:       "List sandboxes",
		Description: "List your running sandboxes: id, profile, when it expires, and which one is this session's own sandbox.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
		InputSchema: schema[listSandboxesIn](nil),
	}, s.listSandboxes)

	sdk.AddTool(s.srv, &sdk.Tool{
		Name:  "kill_sandbox",
		Title: "Destroy a sandbox",
		Description: "Destroy a sandbox at once, with all its processes and files. " +
			"Without sandbox_id it destroys this session's own sandbox; the next tool call then starts a fresh one (useful after a runaway process filled it up).",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
		InputSchema: schema[killIn](nil),
	}, s.killSandbox)

	s.addRunCode()
	s.addComputer()
}

// result builds a tool result from text blocks; empty blocks are skipped.
func result(isErr bool, texts ...string) *sdk.CallToolResult {
	r := &sdk.CallToolResult{IsError: isErr}
	for _, t := range texts {
		if t != "" {
			r.Content = append(r.Content, &sdk.TextContent{Text: t})
		}
	}
	if len(r.Content) == 0 {
		r.Content = []sdk.Content{&sdk.TextContent{Text: "(no output)"}}
	}
	return r
}

// withNote puts note (if any) first in r.
func withNote(r *sdk.CallToolResult, note string) *sdk.CallToolResult {
	if note != "" {
		r.Content = append([]sdk.Content{&sdk.TextContent{Text: note}}, r.Content...)
	}
	return r
}

// toolError turns err into a tool error result. Errors of the sandbox's
// agent are phrased for the model.
func toolError(err error, note string) *sdk.CallToolResult {
	return withNote(result(true, describe(err)), note)
}

// auditFirst records an action about to happen in sb; an error means the
// record could not be written (a full state directory...) and the action
// must not happen: airlock fails closed rather than act unaudited.
func (s *Service) auditFirst(ctx context.Context, sb *manager.Sandbox, action string, detail any) error {
	if err := s.m.AuditFirst(ctx, sb.Owner(), sb.ID, action, detail); err != nil {
		return userErr("refused: %v", err)
	}
	return nil
}

// describe phrases an error for the model.
func describe(err error) string {
	var ue *userError
	if errors.As(err, &ue) {
		return ue.msg
	}
	var ae *agent.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case agent.CodeNotFound:
			return "not found: " + ae.Message
		case agent.CodePermissionDenied:
			return "permission denied: " + ae.Message + " (only /workspace and /tmp are writable)"
		case agent.CodeNoSpace:
			return "no space left: " + ae.Message + " (the sandbox's disk is full; delete files or create_sandbox with a larger profile)"
		case agent.CodeIsADirectory:
			return "is a directory: " + ae.Message + " (use list_files)"
		case agent.CodeNotADirectory:
			return "not a directory: " + ae.Message
		case agent.CodeNotRegular:
			return "not a regular file: " + ae.Message
		case agent.CodeTooLarge:
			return "too large: " + ae.Message
		}
		return ae.Code + ": " + ae.Message
	}
	if errors.Is(err, agent.ErrClosed) {
		return "the sandbox ended during the call (killed, expired or out of memory); omit sandbox_id to get a fresh one"
	}
	return err.Error()
}

// cleanPath checks a path given by the model. The agent resolves it
// inside the sandbox; relative paths are relative to /workspace. Like the
// HTTP API's file paths, it may not contain "..": "../x" would otherwise
// quietly mean "/x".
func cleanPath(p string) (string, error) {
	if p == "" {
		return "", userErr("path is empty")
	}
	if len(p) > 4096 || strings.IndexByte(p, 0) >= 0 || !utf8.ValidString(p) {
		return "", userErr("path is too long, contains a NUL byte or is not UTF-8")
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", userErr("path %q contains '..'; give an absolute path (e.g. /tmp/x) or one relative to /workspace", p)
		}
	}
	if !path.IsAbs(p) {
		p = "/workspace/" + p
	}
	return path.Clean(p), nil
}

// runCommandIn is the input of run_command.
type runCommandIn struct {
	Command        string            `json:"command,omitempty" jsonschema:"Shell command line, run as /bin/sh -c COMMAND. Give this or argv."`
	Argv           []string          `json:"argv,omitempty" jsonschema:"Program and arguments, run without a shell. Give this or command."`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"Working directory; default /workspace. Relative paths are relative to /workspace."`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"Text written to the command's standard input, which is then closed."`
	Env            map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables for this command."`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"Stop the command after this many seconds; 0 or absent means the server's default."`
	SandboxID      string            `json:"sandbox_id,omitempty" jsonschema:"Sandbox to use, as returned by create_sandbox. Omit it to use this session's own sandbox (created on first use, shared by all tools of the session, destroyed when the session ends)."`
}

func (s *Service) runCommand(ctx context.Context, req *sdk.CallToolRequest, in runCommandIn) (*sdk.CallToolResult, any, error) {
	if (in.Command == "") == (len(in.Argv) == 0) {
		return toolError(userErr("give exactly one of command (a shell command line) and argv (a program and its arguments)"), ""), nil, nil
	}
	keys := make([]string, 0, len(in.Env))
	for k, v := range in.Env {
		if !policy.ValidEnvKey(k) || strings.IndexByte(v, 0) >= 0 {
			return toolError(userErr("bad environment variable %q", k), ""), nil, nil
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+in.Env[k])
	}
	timeout, err := s.callTimeout(in.TimeoutSeconds)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	sb, note, err := s.sandbox(ctx, req, in.SandboxID)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	areq := agent.ExecRequest{Argv: in.Argv, Cwd: in.Cwd, Env: env, Stdin: []byte(in.Stdin)}
	argv := in.Argv
	if in.Command != "" {
		areq.Shell = in.Command
		argv = []string{"/bin/sh", "-c", in.Command}
	}
	intent := map[string]any{"via": "mcp", "argv": argv}
	if err := s.auditFirst(ctx, sb, store.ActionExec, intent); err != nil {
		return toolError(err, note), nil, nil
	}
	res := s.exec(ctx, sb, areq, timeout)
	if in.SandboxID == "" && res.status == "error" && errors.Is(res.cause, agent.ErrClosed) {
		// The session's sandbox died before the command started (its
		// agent can die when a runaway process exhausted the sandbox's
		// limits): nothing ran, so run it in a fresh one.
		if sb2, note2, err := s.sandbox(ctx, req, ""); err == nil && sb2 != sb {
			sb, note = sb2, strings.TrimSpace(note+"\n"+note2)
			if err := s.auditFirst(ctx, sb, store.ActionExec, intent); err != nil {
				return toolError(err, note), nil, nil
			}
			res = s.exec(ctx, sb, areq, timeout)
		}
	}
	if res.status == "error" && res.err != nil && isEAGAIN(res.cause) {
		// Code cells may have left processes that fill the sandbox:
		// restarting the interpreters frees them; then try again.
		if n := s.unjam(ctx, sb); n != "" {
			note = strings.TrimSpace(note + "\n" + n)
			res = s.exec(ctx, sb, areq, timeout)
		}
	}
	s.m.Audit(ctx, sb.Owner(), sb.ID, store.ActionExec+".result", map[string]any{"via": "mcp", "argv": argv,
		"exit_code": res.code, "signal": res.signal, "status": res.status, "duration_ms": res.dur.Milliseconds()})
	return withNote(res.toolResult(), note), nil, nil
}

func (s *Service) callTimeout(sec float64) (time.Duration, error) {
	if sec < 0 || sec != sec {
		return 0, userErr("timeout_seconds must not be negative")
	}
	if sec == 0 {
		return s.cfg.CallTimeout, nil
	}
	d := time.Duration(sec * float64(time.Second))
	if d > s.cfg.MaxCallTimeout {
		return 0, userErr("timeout_seconds is above the maximum of %g", s.cfg.MaxCallTimeout.Seconds())
	}
	return d, nil
}

// execResult is how a command ended.
type execResult struct {
	stdout, stderr *capture
	code           int
	signal         string
	// status: ok, nonzero_exit, killed, timeout, cancelled, not_found,
	// not_executable, error.
	status   string
	leftover bool // processes left in the background were killed
	timeout  time.Duration
	dur      time.Duration
	err      error // the sandbox failed (not the command), for the model
	cause    error // the agent's error behind err
}

// exec runs a command to completion, or until timeout or ctx ends. The
// process runs as a "background" process of the agent so that its process
// group can still be signalled after it exits: whatever it left running
// (a fork bomb's children, a forgotten server) is killed before returning.
func (s *Service) exec(ctx context.Context, sb *manager.Sandbox, req agent.ExecRequest, timeout time.Duration) (res execResult) {
	res = execResult{stdout: newCapture(s.cfg.MaxOutput), stderr: newCapture(s.cfg.MaxOutput), timeout: timeout}
	start := time.Now()
	defer func() { res.dur = time.Since(start) }()
	req.Background, req.Tag = true, "mcp"
	c := sb.Agent()
	p, err := c.Exec(ctx, req)
	if err != nil {
		res.cause = err
		var ae *agent.Error
		switch {
		case errors.As(err, &ae) && ae.Code == agent.CodeNotFound:
			res.code, res.status = 127, "not_found"
			res.stderr.Write([]byte(ae.Message + "\n"))
		case errors.As(err, &ae) && ae.Code == agent.CodePermissionDenied:
			res.code, res.status = 126, "not_executable"
			res.stderr.Write([]byte(ae.Message + "\n"))
		case isEAGAIN(err):
			res.status, res.err = "error", userErr("cannot start a process: the sandbox is out of processes or memory (%s). "+
				"kill_sandbox (without sandbox_id for this session's sandbox) gives you a fresh one", strings.TrimPrefix(err.Error(), "agent: io_error: "))
		default:
			res.status, res.err = "error", err
		}
		return res
	}
	defer p.Close()
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	exited := false
	for !exited {
		select {
		case ev, ok := <-p.Events():
			if !ok {
				res.status, res.err = "error", fmt.Errorf("lost the command: %w", c.Err())
				if c.Err() == nil {
					res.err = errors.New("lost the command's output stream")
				}
				killGroup(c, p.Pid)
				return res
			}
			switch ev.Type {
			case agent.EventStdout:
				res.stdout.Write(ev.Data)
			case agent.EventStderr:
				res.stderr.Write(ev.Data)
			case agent.EventExit:
				exited = true
				res.code, res.signal = ev.ExitCode, ev.Signal
			}
		case <-tctx.Done():
			killGroup(c, p.Pid)
			res.code, res.status = -1, "timeout"
			if ctx.Err() != nil {
				res.status = "cancelled"
			}
			return res
		}
	}
	res.leftover = killGroup(c, p.Pid)
	switch {
	case res.signal != "":
		res.status = "killed"
	case res.code != 0:
		res.status = "nonzero_exit"
	default:
		res.status = "ok"
	}
	return res
}

// killGroup kills process group pgid until it has no live member and
// reports whether it had any. It uses its own deadline: it must work when
// the call's context is gone.
func killGroup(c *agent.Client, pgid int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	had := false
	for i := 0; ctx.Err() == nil; i++ {
		if c.Signal(ctx, pgid, 0) != nil {
			return had // no live member, no such process, or the sandbox is gone
		}
		had = true
		if c.Signal(ctx, pgid, syscall.SIGKILL) != nil {
			return had
		}
		time.Sleep(time.Duration(min(1<<i, 20)) * time.Millisecond)
	}
	return had
}

// toolResult maps an execResult to the model's view.
func (r *execResult) toolResult() *sdk.CallToolResult {
	if r.err != nil {
		return toolError(r.err, "")
	}
	out := r.stdout.Text("stdout")
	errText := ""
	if r.stderr.Len() > 0 {
		errText = "stderr:\n" + r.stderr.Text("stderr")
	}
	var status string
	switch r.status {
	case "ok":
	case "nonzero_exit", "not_found", "not_executable":
		status = fmt.Sprintf("exit code %d", r.code)
	case "killed":
		status = fmt.Sprintf("killed by %s (exit code %d); the sandbox's memory or process limit may have been reached", r.signal, r.code)
	case "timeout":
		status = fmt.Sprintf("timed out after %s: the command and its processes were killed (pass a larger timeout_seconds if it needs longer)", r.timeout)
	case "cancelled":
		status = "cancelled: the command and its processes were killed"
	}
	isErr := r.status != "ok"
	if r.leftover {
		isErr = true
		status = strings.TrimPrefix(status+"; ", "; ") +
			"the command left processes running in the background, which were killed (runaway forks are stopped by the sandbox's process limit)"
		if r.status == "ok" {
			status = "exit code 0, but " + status
		}
	}
	if !isErr && out == "" && errText == "" {
		return result(false, "(no output, exit code 0)")
	}
	return result(isErr, out, errText, status)
}

// writeFileIn is the input of write_file.
type writeFileIn struct {
	Path      string `json:"path" jsonschema:"Path of the file inside the sandbox. Relative paths are relative to /workspace, the working directory; /tmp is writable too."`
	Content   string `json:"content" jsonschema:"The file's content: text, or base64 when encoding is base64."`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf-8 (default) or base64."`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"Sandbox to use, as returned by create_sandbox. Omit it to use this session's own sandbox."`
}

func (s *Service) writeFile(ctx context.Context, req *sdk.CallToolRequest, in writeFileIn) (*sdk.CallToolResult, any, error) {
	p, err := cleanPath(in.Path)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	data := []byte(in.Content)
	if in.Encoding == "base64" {
		data, err = base64.StdEncoding.DecodeString(strings.TrimSpace(in.Content))
		if err != nil {
			return toolError(userErr("content is not valid base64: %v", err), ""), nil, nil
		}
	}
	if len(data) > s.cfg.MaxWrite {
		return toolError(userErr("content is %s, above the limit of %s", sizeText(int64(len(data))), sizeText(int64(s.cfg.MaxWrite))), ""), nil, nil
	}
	sb, note, err := s.sandbox(ctx, req, in.SandboxID)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	if err := s.auditFirst(ctx, sb, store.ActionFileWrite, map[string]any{"via": "mcp", "path": p}); err != nil {
		return toolError(err, note), nil, nil
	}
	n, err := sb.Agent().WriteFile(ctx, p, bytes.NewReader(data), 0)
	detail := map[string]any{"via": "mcp", "path": p, "bytes": n}
	if err != nil {
		detail["error"] = err.Error()
	}
	s.m.Audit(ctx, sb.Owner(), sb.ID, store.ActionFileWrite+".result", detail)
	if err != nil {
		return toolError(err, note), nil, nil
	}
	return withNote(result(false, fmt.Sprintf("wrote %d bytes to %s", n, p)), note), nil, nil
}

// readFileIn is the input of read_file.
type readFileIn struct {
	Path      string `json:"path" jsonschema:"Path of the file inside the sandbox. Relative paths are relative to /workspace."`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"Sandbox to use, as returned by create_sandbox. Omit it to use this session's own sandbox."`
}

// imageTypes are the image types returned as image content.
var imageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

func (s *Service) readFile(ctx context.Context, req *sdk.CallToolRequest, in readFileIn) (*sdk.CallToolResult, any, error) {
	p, err := cleanPath(in.Path)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	sb, note, err := s.sandbox(ctx, req, in.SandboxID)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	c := sb.Agent()
	fi, err := c.Stat(ctx, p)
	if err != nil {
		return toolError(err, note), nil, nil
	}
	if fi.Type == agent.TypeDir {
		return toolError(userErr("%s is a directory; use list_files", p), note), nil, nil
	}
	if err := s.checkRead(ctx, req, sb.ID, p, fi.Size); err != nil {
		return toolError(err, note), nil, nil
	}
	rc, err := c.ReadFile(ctx, p)
	if err != nil {
		return toolError(err, note), nil, nil
	}
	defer rc.Close()
	limit := max(s.cfg.MaxReadText, s.cfg.MaxReadImage)
	data, err := io.ReadAll(io.LimitReader(rc, int64(limit)+1))
	if err != nil {
		return toolError(err, note), nil, nil
	}
	complete := len(data) <= limit
	size := int64(len(data))
	if fi.Type == agent.TypeFile {
		size = max(fi.Size, size)
	}
	sizeDesc := sizeText(size)
	if !complete && size <= int64(limit)+1 {
		sizeDesc = "more than " + sizeText(int64(limit)) // a symlink: the target's size is unknown
	}
	sniff := http.DetectContentType(data)
	if imageTypes[sniff] {
		if !complete || len(data) > s.cfg.MaxReadImage {
			return withNote(result(false, fmt.Sprintf("%s is a %s image of %s, above the %s this tool returns; make a smaller copy (e.g. with python3 and matplotlib or PIL) and read that",
				p, sniff, sizeDesc, sizeText(int64(s.cfg.MaxReadImage)))), note), nil, nil
		}
		return withNote(&sdk.CallToolResult{Content: []sdk.Content{&sdk.ImageContent{Data: data, MIMEType: sniff}}}, note), nil, nil
	}
	text := data
	if len(text) > s.cfg.MaxReadText {
		text = trimPartialEnd(text[:s.cfg.MaxReadText])
	}
	if bytes.IndexByte(text, 0) >= 0 || !utf8.Valid(text) {
		return withNote(result(false, fmt.Sprintf("%s is a binary file (%s, detected as %s); it is not shown. Inspect it with run_command (e.g. file, od -c | head, python3)", p, sizeDesc, sniff)), note), nil, nil
	}
	out := string(text)
	if int64(len(text)) < size {
		out += fmt.Sprintf("\n[... truncated: showing the first %s of %s; use run_command with head, tail, sed -n or grep to read other parts ...]\n", sizeText(int64(len(text))), sizeDesc)
	}
	if out == "" {
		out = fmt.Sprintf("(%s is empty)", p)
	}
	return withNote(result(false, out), note), nil, nil
}

// listFilesIn is the input of list_files.
type listFilesIn struct {
	Path      string `json:"path,omitempty" jsonschema:"Directory to list; default /workspace. Relative paths are relative to /workspace."`
	Depth     int    `json:"depth,omitempty" jsonschema:"How many levels to descend: 1 (default) lists the directory's own entries."`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"Sandbox to use, as returned by create_sandbox. Omit it to use this session's own sandbox."`
}

// maxListed caps the entries list_files shows.
const maxListed = 1000

func (s *Service) listFiles(ctx context.Context, req *sdk.CallToolRequest, in listFilesIn) (*sdk.CallToolResult, any, error) {
	if in.Path == "" {
		in.Path = "/workspace"
	}
	p, err := cleanPath(in.Path)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	depth := in.Depth
	if depth == 0 {
		depth = 1
	}
	if depth < 1 || depth > 5 {
		return toolError(userErr("depth must be between 1 and 5"), ""), nil, nil
	}
	sb, note, err := s.sandbox(ctx, req, in.SandboxID)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	list, err := sb.Agent().List(ctx, p, depth)
	var ae *agent.Error
	truncated := errors.As(err, &ae) && ae.Code == agent.CodeTooLarge
	if err != nil && !truncated {
		return toolError(err, note), nil, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d entries", p, len(list))
	if depth > 1 {
		fmt.Fprintf(&b, " (%d levels)", depth)
	}
	b.WriteString("\n")
	for i, fi := range list {
		if i == maxListed {
			fmt.Fprintf(&b, "[... %d more entries not shown; list a subdirectory or use a smaller depth ...]\n", len(list)-maxListed)
			break
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(fi.Path, p), "/")
		if rel == "" {
			rel = fi.Name
		}
		switch fi.Type {
		case agent.TypeDir:
			fmt.Fprintf(&b, "d %10s %s/\n", "-", rel)
		case agent.TypeFile:
			fmt.Fprintf(&b, "f %10d %s\n", fi.Size, rel)
		case agent.TypeSymlink:
			fmt.Fprintf(&b, "l %10s %s -> %s\n", "-", rel, fi.Target)
		default:
			fmt.Fprintf(&b, "o %10s %s\n", "-", rel)
		}
	}
	if truncated {
		b.WriteString("[... the listing was cut by the sandbox's entry limit; list a subdirectory or use a smaller depth ...]\n")
	}
	return withNote(result(false, b.String()), note), nil, nil
}

// createIn is the input of create_sandbox.
type createIn struct {
	Profile        string            `json:"profile,omitempty" jsonschema:"Policy preset: strict (default), standard or light."`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"Lifetime in seconds, after which the sandbox is destroyed; default the server's sandbox timeout."`
	MemoryMB       int64             `json:"memory_mb,omitempty" jsonschema:"Memory limit in MiB; default the profile's."`
	CPUs           float64           `json:"cpus,omitempty" jsonschema:"CPU limit in cores; default the profile's."`
	Pids           int64             `json:"pids,omitempty" jsonschema:"Limit on processes and threads; default the profile's."`
	Network        string            `json:"network,omitempty" jsonschema:"none: no network at all; default (when omitted): the server's network policy, narrowed to allow if given."`
	Allow          []string          `json:"allow,omitempty" jsonschema:"Destinations to allow, a subset of the server's policy (host names, *.wildcards, IPs or CIDRs, optionally :PORT); omit for all the server allows."`
	Env            map[string]string `json:"env,omitempty" jsonschema:"Environment variables for every process in the sandbox."`
	Label          string            `json:"label,omitempty" jsonschema:"A short name shown by list_sandboxes."`
	Runtime        string            `json:"runtime,omitempty" jsonschema:"Isolation tier: native or gvisor (gVisor's user-space kernel between the code and the host kernel; egress through the same proxy); default the server's."`
	Template       string            `json:"template,omitempty" jsonschema:"Name of a template or image in the server's image store that this key may use (its own: built, pulled or snapshotted with this key; or one the operator published) to use as the sandbox's root filesystem; default the host-derived root."`
}

func (s *Service) createSandbox(ctx context.Context, req *sdk.CallToolRequest, in createIn) (*sdk.CallToolResult, any, error) {
	network, err := s.narrowNetwork(in.Network, in.Allow)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	if !validLabel(in.Label) {
		return toolError(userErr("label must be at most 128 printable characters"), ""), nil, nil
	}
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds != in.TimeoutSeconds || in.MemoryMB < 0 || in.CPUs < 0 || in.Pids < 0 {
		return toolError(userErr("timeout_seconds, memory_mb, cpus and pids must not be negative"), ""), nil, nil
	}
	se, err := s.sessionOf(req)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	cr := manager.CreateRequest{Owner: se.owner, OwnerLimit: se.ownerLimit, Profile: s.cfg.Profile,
		Limits: s.cfg.Limits, Env: in.Env, Timeout: time.Duration(in.TimeoutSeconds * float64(time.Second)),
		Network: network, Secrets: s.cfg.Secrets, Runtime: in.Runtime, Image: in.Template,
		Metadata: map[string]string{"created_by": "mcp", "mcp_role": "created"}}
	if cr.Timeout == 0 {
		cr.Timeout = s.cfg.SandboxTimeout
	}
	if in.Profile != "" && in.Profile != s.cfg.Profile {
		// Another profile: its own limits, not the operator's overrides
		// of the default profile.
		cr.Profile, cr.Limits = in.Profile, manager.Limits{}
	}
	if in.MemoryMB > 0 {
		cr.Limits.MemoryBytes = in.MemoryMB << 20
	}
	if in.CPUs > 0 {
		cr.Limits.CPUs = in.CPUs
	}
	if in.Pids > 0 {
		cr.Limits.Pids = in.Pids
	}
	if in.Label != "" {
		cr.Metadata["label"] = in.Label
	}
	info, err := s.m.Create(ctx, cr)
	if err != nil {
		return toolError(s.createError(err), ""), nil, nil
	}
	exp := ""
	if info.ExpiresAt != nil {
		exp = fmt.Sprintf("; it is destroyed at %s (in %s) unless you kill_sandbox it earlier",
			info.ExpiresAt.Format(time.RFC3339), time.Until(*info.ExpiresAt).Round(time.Second))
	}
	from := ""
	if in.Template != "" {
		from = ", root from template " + in.Template
	}
	return result(false, fmt.Sprintf("created sandbox %s (profile %s%s, %s%s).\nPass sandbox_id=%q to run_command, write_file, read_file, list_files%s to use it.",
		info.ID, info.Profile, from, netSummary(network), exp, info.ID, ", run_code")), nil, nil
}

// listSandboxesIn is the (empty) input of list_sandboxes.
type listSandboxesIn struct{}

func (s *Service) listSandboxes(ctx context.Context, req *sdk.CallToolRequest, _ listSandboxesIn) (*sdk.CallToolResult, any, error) {
	se, err := s.sessionOf(req)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	se.mu.Lock()
	mine := se.defaultID
	se.mu.Unlock()
	list, err := s.m.List(ctx, se.owner, manager.ListOptions{})
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	if len(list) == 0 {
		return result(false, "no running sandboxes; tools called without sandbox_id create this session's own sandbox on first use"), nil, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d running sandboxes:\n", len(list))
	for _, in := range list {
		fmt.Fprintf(&b, "%s  profile %s  created %s", in.ID, in.Profile, in.CreatedAt.Format(time.RFC3339))
		if in.ExpiresAt != nil {
			fmt.Fprintf(&b, "  expires %s", in.ExpiresAt.Format(time.RFC3339))
		}
		if l := in.Metadata["label"]; l != "" {
			fmt.Fprintf(&b, "  label %q", l)
		}
		switch {
		case in.ID == mine:
			b.WriteString("  (this session's own sandbox)")
		case in.Metadata["mcp_role"] == "session-default":
			b.WriteString("  (another MCP session's sandbox)")
		}
		b.WriteString("\n")
	}
	return result(false, b.String()), nil, nil
}

// killIn is the input of kill_sandbox.
type killIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"Sandbox to destroy. Omit it to destroy this session's own sandbox; the next call starts a fresh one."`
}

func (s *Service) killSandbox(ctx context.Context, req *sdk.CallToolRequest, in killIn) (*sdk.CallToolResult, any, error) {
	se, err := s.sessionOf(req)
	if err != nil {
		return toolError(err, ""), nil, nil
	}
	id := in.SandboxID
	se.mu.Lock()
	if id == "" {
		id = se.defaultID
	}
	if id != "" && id == se.defaultID {
		se.defaultID = ""
	}
	se.mu.Unlock()
	if id == "" {
		return result(false, "this session has no sandbox yet; nothing to destroy"), nil, nil
	}
	if err := s.m.Kill(ctx, se.owner, id); err != nil {
		return toolError(s.lookupError(ctx, se.owner, id, err), ""), nil, nil
	}
	return result(false, fmt.Sprintf("destroyed sandbox %s", id)), nil, nil
}

// createNetworkText describes create_sandbox's network choices.
func (s *Service) createNetworkText() string {
	if s.cfg.Network.Mode == policy.NetNone {
		return "There is no network access on this server: only network=\"none\" is accepted. "
	}
	return "By default it gets the server's network policy (" + netSummary(s.cfg.Network) + "); network=\"none\" turns the network off, and allow narrows it to some of the destinations the server allows. It cannot be widened. "
}

// netSummary is a short description of a network policy.
func netSummary(n policy.Network) string {
	switch n.Mode {
	case policy.NetAllowlist:
		return "network limited to " + strings.Join(n.Allow, ", ")
	case policy.NetOpen:
		if len(n.Deny) > 0 {
			return "public network except " + strings.Join(n.Deny, ", ")
		}
		return "public network"
	}
	return "no network"
}

// narrowNetwork turns create_sandbox's network and allow into a policy no
// wider than the server's: none, the server's, or an allowlist of entries
// the server's allowlist names verbatim (any valid entry when the server
// is open), always with the server's deny list.
func (s *Service) narrowNetwork(mode string, allow []string) (policy.Network, error) {
	srv := s.cfg.Network
	switch mode {
	case "none":
		if len(allow) > 0 {
			return policy.Network{}, userErr("allow makes no sense with network \"none\"")
		}
		return policy.Network{Mode: policy.NetNone}, nil
	case "", "default":
	default:
		return policy.Network{}, userErr("network must be none or default, not %q", mode)
	}
	if len(allow) == 0 {
		return srv, nil
	}
	if srv.Mode == policy.NetNone {
		return policy.Network{}, userErr("this server gives sandboxes no network access; allow cannot add any")
	}
	for _, a := range allow {
		if srv.Mode == policy.NetAllowlist && !slices.Contains(srv.Allow, a) {
			return policy.Network{}, userErr("%q is not in the server's network policy (%s); allow can only narrow it", a, strings.Join(srv.Allow, ", "))
		}
	}
	n := policy.Network{Mode: policy.NetAllowlist, Allow: slices.Clone(allow), Deny: slices.Clone(srv.Deny)}
	if err := (egress.Policy{Mode: string(n.Mode), Allow: n.Allow, Deny: n.Deny}).Validate(); err != nil {
		return policy.Network{}, userErr("allow: %v", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return n, nil
}

// validLabel reports whether a label has at most 128 characters and no
// control characters.
func validLabel(s string) bool {
	if utf8.RuneCountInString(s) > 128 {
		return false
	}
	for _, r := range s {
		if r < 0x20 {
			return false
		}
	}
	return true
}
