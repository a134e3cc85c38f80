package e2b

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/manager"
)

// scriptedInterp is a test double of the Interpreter: it checks how the
// handler maps E2B's interpreter protocol onto the interface, with
// outputs scripted by the test. It runs no code.
type scriptedInterp struct {
	mu       sync.Mutex
	contexts []CodeContext
	requests []CellRequest
}

func (f *scriptedInterp) CreateContext(ctx context.Context, sb *manager.Sandbox, language, cwd string) (CodeContext, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if language != "python" && language != "javascript" {
		return CodeContext{}, fmt.Errorf("%w: %s", ErrLanguage, language)
	}
	c := CodeContext{ID: fmt.Sprintf("ctx-%d", len(f.contexts)+1), Language: language, Cwd: cwd}
	f.contexts = append(f.contexts, c)
	return c, nil
}

func (f *scriptedInterp) Contexts(ctx context.Context, sb *manager.Sandbox) ([]CodeContext, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]CodeContext(nil), f.contexts...), nil
}

func (f *scriptedInterp) find(id string) int {
	for i, c := range f.contexts {
		if c.ID == id {
			return i
		}
	}
	return -1
}

func (f *scriptedInterp) RemoveContext(ctx context.Context, sb *manager.Sandbox, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.find(id)
	if i < 0 {
		return ErrContextNotFound
	}
	f.contexts = append(f.contexts[:i], f.contexts[i+1:]...)
	return nil
}

func (f *scriptedInterp) RestartContext(ctx context.Context, sb *manager.Sandbox, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.find(id) < 0 {
		return ErrContextNotFound
	}
	return nil
}

var pngBytes = []byte("\x89PNG\r\n\x1a\nrest")

func (f *scriptedInterp) Execute(ctx context.Context, sb *manager.Sandbox, req CellRequest, emit func(CellOutput)) (CellEnd, error) {
	f.mu.Lock()
	f.requests = append(f.requests, req)
	known := req.ContextID == "" || f.find(req.ContextID) >= 0
	f.mu.Unlock()
	if !known {
		return CellEnd{}, ErrContextNotFound
	}
	switch req.Code {
	case "rich":
		emit(CellOutput{Type: "stdout", Text: "hello\n"})
		emit(CellOutput{Type: "stderr", Text: "warn\n"})
		emit(CellOutput{Type: "result", Data: map[string]string{"image/png": base64.StdEncoding.EncodeToString(pngBytes), "text/plain": "<Figure>"}})
		emit(CellOutput{Type: "result", Main: true, Data: map[string]string{"text/plain": "'a string'", "text/html": "<b>x</b>",
			"application/json": `{"k":[1,2]}`, "application/x-custom": "zz"}})
		return CellEnd{ExecutionCount: 7}, nil
	case "fail":
		emit(CellOutput{Type: "stdout", Text: "before\n"})
		emit(CellOutput{Type: "error", Error: &CellError{Name: "ZeroDivisionError", Value: "division by zero",
			Traceback: []string{"Traceback (most recent call last):", "ZeroDivisionError: division by zero"}}})
		return CellEnd{ExecutionCount: 8}, nil
	}
	return CellEnd{ExecutionCount: 1}, nil
}

// TestInterpreterProtocolWithSDK drives the interpreter port through the
// real @e2b/code-interpreter SDK, against a real sandbox, with a scripted
// Interpreter behind it: what the SDK makes of airlock's NDJSON, context
// objects and error statuses.
func TestInterpreterProtocolWithSDK(t *testing.T) {
	jsDir, _ := filepath.Abs("../tests/js")
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules", "@e2b", "code-interpreter")); err != nil {
		t.Skip("tests/js/node_modules is missing: run npm ci in tests/js")
	}
	fi := &scriptedInterp{}
	e := newEnvWith(t, true, fi)
	var created sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"code-interpreter-v1"}`).json(t, &created)
	script := `
import { Sandbox } from '@e2b/code-interpreter'
const sbx = await Sandbox.connect(process.env.SBX)
const out = {}
const rich = await sbx.runCode('rich')
out.rich = { text: rich.text, logs: rich.logs, count: rich.executionCount, error: rich.error ?? null,
  results: rich.results.map((r) => ({ main: r.isMainResult, formats: r.formats(), text: r.text, png: r.png, html: r.html, json: r.json, extra: r.extra })) }
const fail = await sbx.runCode('fail', { language: 'python' })
out.fail = { name: fail.error.name, value: fail.error.value, traceback: fail.error.traceback, stdout: fail.logs.stdout }
const ctx = await sbx.createCodeContext({ language: 'javascript', cwd: '/home/user/proj' })
out.ctx = ctx
await sbx.runCode('x', { context: ctx, envs: { A: 'b' } })
out.list = await sbx.listCodeContexts()
await sbx.restartCodeContext(ctx)
await sbx.removeCodeContext(ctx.id)
try { await sbx.runCode('x', { context: ctx }); out.missing = 'no error' } catch (e) { out.missing = e.name + ': ' + e.message }
try { await sbx.createCodeContext({ language: 'cobol' }); out.cobol = 'no error' } catch (e) { out.cobol = e.name + ': ' + e.message }
console.log(JSON.stringify(out))
process.exit(0)
`
	cmd := exec.Command("node", "--input-type=module", "-e", script)
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+e.url, "E2B_SANDBOX_URL="+e.url, "E2B_API_KEY="+e.key, "SBX="+created.SandboxID)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, b)
	}
	var out struct {
		Rich struct {
			Text    *string
			Logs    struct{ Stdout, Stderr []string }
			Count   int
			Error   any
			Results []struct {
				Main    bool
				Formats []string
				Text    *string
				Png     *string
				HTML    *string
				JSON    any
				Extra   map[string]any
			}
		}
		Fail struct {
			Name, Value, Traceback string
			Stdout                 []string
		}
		Ctx     contextJSON
		List    []contextJSON
		Missing string
		Cobol   string
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	r := out.Rich
	if r.Text == nil || *r.Text != "a string" || r.Count != 7 || r.Error != nil ||
		strings.Join(r.Logs.Stdout, "") != "hello\n" || strings.Join(r.Logs.Stderr, "") != "warn\n" || len(r.Results) != 2 {
		t.Fatalf("rich cell: %s", b)
	}
	if fig := r.Results[0]; fig.Main || fig.Png == nil || *fig.Png != base64.StdEncoding.EncodeToString(pngBytes) {
		t.Errorf("figure: %+v", fig)
	}
	main := r.Results[1]
	if !main.Main || main.HTML == nil || *main.HTML != "<b>x</b>" || fmt.Sprint(main.JSON) != "map[k:[1 2]]" {
		t.Errorf("main result: %+v", main)
	}
	// Other MIME types travel nested in "extra", as from E2B's server (the
	// JS SDK 2.8.0 drops them; the Python SDK keeps them).
	hdr := map[string]string{"E2b-Sandbox-Id": created.SandboxID, "E2b-Sandbox-Port": "49999",
		"E2b-Traffic-Access-Token": created.TrafficAccessToken, "Content-Type": "application/json"}
	raw := e.do(t, "POST", "/execute", hdr, []byte(`{"code":"rich"}`))
	lines := strings.Split(strings.TrimSpace(string(raw.body)), "\n")
	if raw.status != 200 || raw.header.Get("Content-Type") != "application/x-ndjson" || len(lines) != 6 ||
		!strings.Contains(lines[3], `"extra":{"application/x-custom":"zz"}`) || !strings.Contains(lines[3], `"json":{"k":[1,2]}`) ||
		lines[4] != `{"execution_count":7,"type":"number_of_executions"}` || lines[5] != `{"type":"end_of_execution"}` ||
		!strings.Contains(lines[0], `"timestamp":`) {
		t.Errorf("NDJSON: %d %v\n%s", raw.status, raw.header, raw.body)
	}
	hdr["E2b-Traffic-Access-Token"] = "wrong"
	e.do(t, "POST", "/execute", hdr, []byte(`{"code":"rich"}`)).apiErr(t, 401)
	if out.Fail.Name != "ZeroDivisionError" || out.Fail.Value != "division by zero" ||
		!strings.Contains(out.Fail.Traceback, "Traceback") || strings.Join(out.Fail.Stdout, "") != "before\n" {
		t.Errorf("failing cell: %+v", out.Fail)
	}
	if out.Ctx.ID == "" || out.Ctx.Language != "javascript" || out.Ctx.Cwd != "/home/user/proj" {
		t.Errorf("context %+v", out.Ctx)
	}
	if len(out.List) != 1 || out.List[0] != out.Ctx {
		t.Errorf("contexts %+v", out.List)
	}
	// A language the sandbox lacks is a 404 too: the SDKs show the body
	// of a 404 and only the status line of a 400.
	if !strings.HasPrefix(out.Missing, "NotFoundError") || !strings.HasPrefix(out.Cobol, "NotFoundError") || !strings.Contains(out.Cobol, `"cobol" is not available`) {
		t.Errorf("errors: missing context %q, unknown language %q", out.Missing, out.Cobol)
	}
	fi.mu.Lock()
	defer fi.mu.Unlock()
	if len(fi.contexts) != 0 {
		t.Errorf("context not removed: %+v", fi.contexts)
	}
	if len(fi.requests) < 4 || fi.requests[1].Language != "python" || fi.requests[2].ContextID != out.Ctx.ID || fi.requests[2].Env["A"] != "b" {
		t.Errorf("requests %+v", fi.requests)
	}
}

// TestExecuteHeadersBeforeOutput checks that /execute answers its headers
// as soon as the cell runs, before any output: the SDKs' request timeout
// (60 s) runs until the headers arrive and only the cell's timeoutMs
// after, so a cell silent for longer than that must have them early. The
// cell here prints nothing until the test, having received the headers,
// lets it go; a missing context is still a 404 before any stream.
func TestExecuteHeadersBeforeOutput(t *testing.T) {
	e := newEnvWith(t, true, AgentInterpreter{})
	var created sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"code-interpreter-v1"}`).json(t, &created)
	defer e.api(t, "DELETE", "/sandboxes/"+created.SandboxID, e.key, "")
	hdr := map[string]string{"E2b-Sandbox-Id": created.SandboxID, "E2b-Sandbox-Port": "49999",
		"E2b-Traffic-Access-Token": created.TrafficAccessToken, "Content-Type": "application/json"}
	cell := `{"code":"import os, time\nwhile not os.path.exists('/tmp/go'):\n    time.sleep(0.02)\nprint('after the go')"}`
	req, _ := http.NewRequest("POST", e.url+"/execute", strings.NewReader(cell))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("no response headers while the cell is silent: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	// Only now may the cell print: from another context.
	r := e.do(t, "POST", "/execute", hdr, []byte(`{"code":"require('fs').writeFileSync('/tmp/go', '')","language":"javascript"}`))
	if r.status != 200 || !strings.Contains(string(r.body), "end_of_execution") {
		t.Fatalf("releasing the cell: %d %s", r.status, r.body)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(body), `"text":"after the go\n"`) || !strings.Contains(string(body), "end_of_execution") {
		t.Fatalf("stream: %v\n%s", err, body)
	}
	r = e.do(t, "POST", "/execute", hdr, []byte(`{"code":"1","context_id":"ctx-0000000000000000"}`))
	if r.status != 404 || !strings.Contains(string(r.body), "ctx-0000000000000000") {
		t.Fatalf("missing context: %d %s", r.status, r.body)
	}
}

// TestExecuteCutWhenSandboxKilled: a sandbox killed while a cell runs ends
// the cell's stream as E2B's does, with the connection: after an error line
// that says why (SandboxEnded, "was killed"), the response is cut before
// its end (no end_of_execution), so runCode rejects (E2B's
// killedSandbox.test.ts) instead of resolving as if the cell had ended.
func TestExecuteCutWhenSandboxKilled(t *testing.T) {
	e := newEnvWith(t, true, AgentInterpreter{})
	var created sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"code-interpreter-v1"}`).json(t, &created)
	req, _ := http.NewRequest("POST", e.url+"/execute", strings.NewReader(`{"code":"print('started', flush=True)\nimport time\ntime.sleep(300)"}`))
	for k, v := range map[string]string{"E2b-Sandbox-Id": created.SandboxID, "E2b-Sandbox-Port": "49999",
		"E2b-Traffic-Access-Token": created.TrafficAccessToken, "Content-Type": "application/json"} {
		req.Header.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("execute: %v %v", resp, err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("before the cell started: %v", err)
		}
		if strings.Contains(line, "started") {
			break
		}
	}
	if r := e.api(t, "DELETE", "/sandboxes/"+created.SandboxID, e.key, ""); r.status != 204 {
		t.Fatalf("kill: %d %s", r.status, r.body)
	}
	rest, err := io.ReadAll(br)
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stream ended cleanly (%v), want it cut: %s", err, rest)
	}
	if !strings.Contains(string(rest), `"name":"SandboxEnded"`) || !strings.Contains(string(rest), "was killed") || strings.Contains(string(rest), "end_of_execution") {
		t.Fatalf("rest of the stream (%v): %s", err, rest)
	}
}
