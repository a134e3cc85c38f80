package mcp_test

import (
	"bytes"
	"image/png"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/mcp"
)

func py(code string) map[string]any { return map[string]any{"language": "python", "code": code} }

// images returns a result's image contents.
func images(r *sdk.CallToolResult) []*sdk.ImageContent {
	var out []*sdk.ImageContent
	for _, c := range r.Content {
		if ic, ok := c.(*sdk.ImageContent); ok {
			out = append(out, ic)
		}
	}
	return out
}

// TestRunCode: state persists across cells, figures come back as PNG
// images, exceptions are tool errors with their traceback, timeouts keep
// the state.
func TestRunCode(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	mustOK(t, cs, "run_code", py("x = 41\nimport math"))
	if out := mustOK(t, cs, "run_code", py("x + 1")); strings.TrimSpace(out) != "42" {
		t.Fatalf("x + 1: %q", out)
	}
	if out := mustOK(t, cs, "run_code", py("print('sqrt', math.sqrt(x - 25))\nimport sys; print('warn', file=sys.stderr)")); out != "sqrt 4.0\n\nstderr:\nwarn\n\n" {
		t.Fatalf("print: %q", out)
	}
	r := call(t, cs, "run_code", py("import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(4, 3), dpi=50)\nplt.plot([1, 2, 3], [x, 0, x])\nplt.title('t')\nplt.show()"))
	if r.IsError {
		t.Fatalf("plot: %s", text(r))
	}
	imgs := images(r)
	if len(imgs) != 1 || imgs[0].MIMEType != "image/png" {
		t.Fatalf("plot content: %+v", r.Content)
	}
	img, err := png.Decode(bytes.NewReader(imgs[0].Data))
	if err != nil || img.Bounds().Dx() != 200 || img.Bounds().Dy() != 150 {
		t.Fatalf("plot png: %v %v", err, img)
	}
	// A DataFrame shows its text form.
	if out := mustOK(t, cs, "run_code", py("import pandas as pd\npd.DataFrame({'city': ['Oslo'], 'temp': [x]})")); !strings.Contains(out, "city") || !strings.Contains(out, "Oslo") || strings.Contains(out, "<table") {
		t.Fatalf("dataframe: %q", out)
	}
	out := mustFail(t, cs, "run_code", py("def f():\n    return 1/0\nf()"))
	if !strings.Contains(out, "ZeroDivisionError") || !strings.Contains(out, "in f") {
		t.Fatalf("exception: %q", out)
	}
	start := time.Now()
	out = mustFail(t, cs, "run_code", map[string]any{"language": "python", "code": "while True: pass", "timeout_seconds": 1})
	if !strings.Contains(out, "TimeoutError") || time.Since(start) > 15*time.Second {
		t.Fatalf("timeout: %q after %s", out, time.Since(start))
	}
	if out := mustOK(t, cs, "run_code", py("x")); strings.TrimSpace(out) != "41" {
		t.Fatalf("state after a timeout: %q", out)
	}
	// Files are shared with the other tools.
	mustOK(t, cs, "run_code", py("open('from_python.txt', 'w').write('hi')"))
	if out := mustOK(t, cs, "read_file", map[string]any{"path": "from_python.txt"}); out != "hi\n" {
		t.Fatalf("file from python: %q", out)
	}
	// JavaScript and bash keep state too.
	mustOK(t, cs, "run_code", map[string]any{"language": "javascript", "code": "let n = 20"})
	if out := mustOK(t, cs, "run_code", map[string]any{"language": "javascript", "code": "n * 2 + 2"}); strings.TrimSpace(out) != "42" {
		t.Fatalf("javascript: %q", out)
	}
	mustOK(t, cs, "run_code", map[string]any{"language": "bash", "code": "V=kept; cd /tmp"})
	if out := mustOK(t, cs, "run_code", map[string]any{"language": "bash", "code": "echo $V $(pwd)"}); out != "kept /tmp\n\n" {
		t.Fatalf("bash: %q", out)
	}
	mustFail(t, cs, "run_code", map[string]any{"language": "bash", "code": "false"})
	mustFail(t, cs, "run_code", map[string]any{"language": "cobol", "code": "x"})
	// A crash loses the state, and the next cell says so.
	mustFail(t, cs, "run_code", py("import os; os._exit(3)"))
	out = mustFail(t, cs, "run_code", py("x"))
	if !strings.Contains(out, "interpreter had died") || !strings.Contains(out, "NameError") {
		t.Fatalf("after a crash: %q", out)
	}
}

// recovered reports whether a result says the sandbox was freed from
// runaway processes: interpreters restarted, or (when the sandbox's agent
// did not survive them) a fresh sandbox.
func recovered(out string) bool {
	return strings.Contains(out, "interpreter(s) were restarted") || strings.Contains(out, "this call runs in a fresh sandbox")
}

// TestRunCodeHostile: a fork bomb and a memory bomb from Python are tool
// errors; the sandbox stays usable.
func TestRunCodeHostile(t *testing.T) {
	e := newEnv(t, func(c *mcp.Config) { c.Limits.Pids = 64 })
	cs := e.connect(t)
	mustOK(t, cs, "run_code", py("keep = 1"))
	start := time.Now()
	out := mustFail(t, cs, "run_code", map[string]any{"language": "python", "code": "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", "timeout_seconds": 2})
	t.Logf("fork bomb: %q after %s", out, time.Since(start))
	if !strings.Contains(out, "TimeoutError") && !strings.Contains(out, "sandbox ended during the call") || strings.Contains(out, "were restarted") && strings.Contains(out, "variables are kept") {
		t.Fatalf("fork bomb result: %q", out)
	}
	// The sandbox's agent may not survive a fork bomb (the Go runtime
	// dies when it cannot create a thread): then the next call says so
	// and runs in a fresh sandbox.
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "echo alive"}); !strings.HasSuffix(out, "alive\n\n") {
		t.Fatalf("after the fork bomb: %q", out)
	}
	// A cell that succeeds but leaves a forking child behind: the next
	// command frees the sandbox and runs.
	mustOK(t, cs, "run_code", py("import os, time\nif os.fork() == 0:\n    while True:\n        try: os.fork()\n        except OSError: pass\ntime.sleep(1)"))
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "echo freed"}); !recovered(out) || !strings.HasSuffix(out, "freed\n\n") {
		t.Fatalf("after a runaway child: %q", out)
	}
	mustOK(t, cs, "run_code", py("1"))
	out = mustFail(t, cs, "run_code", py("b = bytearray(8 << 30)"))
	if !strings.Contains(out, "MemoryError") && !strings.Contains(out, "died") {
		t.Fatalf("memory bomb: %q", out)
	}
	mustFail(t, cs, "run_code", py("open('/etc/shadow').read()"))
	if out := mustOK(t, cs, "run_code", py("2 + 2")); strings.TrimSpace(out) != "4" && !strings.Contains(out, "4") {
		t.Fatalf("after the bombs: %q", out)
	}
}
