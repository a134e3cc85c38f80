package server_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"image/png"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// codeServer starts a server and a sandbox for the code tests.
func codeServer(t *testing.T, args ...string) (*client.Client, string, *srv) {
	t.Helper()
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "alice")
	s := startServer(t, state, args...)
	c := client.New(s.URL, key)
	sb, err := c.Create(ctxT(t), client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return c, sb.ID, s
}

func runCell(t *testing.T, c *client.Client, id string, req client.CodeRequest) *client.CodeResult {
	t.Helper()
	res, err := c.RunCode(ctxT(t), id, req)
	if err != nil {
		t.Fatalf("cell %q: %v", req.Code, err)
	}
	return res
}

// TestCodeInterpreterE2E drives the code interpreter through the Go client
// against a real airlock serve: state between cells, rich results, errors,
// timeouts, JavaScript and bash contexts, capped output, streaming,
// interrupts and contexts CRUD; once per runtime (see TestE2ELifecycle).
func TestCodeInterpreterE2E(t *testing.T) {
	forEachRuntime(t, codeInterpreterE2E)
}

func codeInterpreterE2E(t *testing.T, runtime string) {
	c, id, _ := codeServer(t, "--default-runtime", runtime)
	ctx := ctxT(t)

	if res := runCell(t, c, id, client.CodeRequest{Code: "x = 41"}); res.Error != nil {
		t.Fatalf("x = 41: %+v", res.Error)
	}
	res := runCell(t, c, id, client.CodeRequest{Code: "x + 1"})
	if res.Text != "42" || len(res.Results) != 1 || res.Results[0]["text/plain"] != "42" || res.ExecutionCount != 2 {
		t.Fatalf("x + 1: %+v", res)
	}

	t.Run("per-cell env", func(t *testing.T) {
		res := runCell(t, c, id, client.CodeRequest{Code: "import os; os.environ.get('CELL_VAR')", Env: map[string]string{"CELL_VAR": "only-here"}})
		if res.Text != "'only-here'" {
			t.Fatalf("with env: %+v", res)
		}
		if res := runCell(t, c, id, client.CodeRequest{Code: "import os; os.environ.get('CELL_VAR')"}); res.Text != "" && res.Text != "None" {
			t.Fatalf("env leaked into the next cell: %+v", res)
		}
	})

	t.Run("matplotlib", func(t *testing.T) {
		res := runCell(t, c, id, client.CodeRequest{Code: "import matplotlib.pyplot as plt\n" +
			"fig = plt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"})
		if res.Error != nil || len(res.Results) != 1 {
			t.Fatalf("plot: %+v", res)
		}
		b, err := base64.StdEncoding.DecodeString(res.Results[0]["image/png"])
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Fatalf("image/png is not a PNG: %v %q", err, b[:min(len(b), 16)])
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if sz := img.Bounds().Size(); sz.X != 400 || sz.Y != 300 {
			t.Fatalf("figure is %v, want 400x300", sz)
		}
	})

	t.Run("dataframe", func(t *testing.T) {
		res := runCell(t, c, id, client.CodeRequest{Code: "import pandas as pd\npd.DataFrame({'alpha': [1, 2], 'beta': [3, 4]})"})
		html := ""
		for _, r := range res.Results {
			html += r["text/html"]
		}
		if !strings.Contains(html, "alpha") || !strings.Contains(html, "beta") || !strings.Contains(html, "<table") {
			t.Fatalf("DataFrame HTML: %+v", res)
		}
	})

	t.Run("exception", func(t *testing.T) {
		res := runCell(t, c, id, client.CodeRequest{Code: "1/0"})
		if res.Error == nil || res.Error.Name != "ZeroDivisionError" || len(res.Error.Traceback) == 0 {
			t.Fatalf("1/0: %+v", res)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		res := runCell(t, c, id, client.CodeRequest{Code: "while True: pass", Timeout: time.Second})
		if res.Error == nil || res.Error.Name != "TimeoutError" {
			t.Fatalf("timeout: %+v", res.Error)
		}
		if res := runCell(t, c, id, client.CodeRequest{Code: "x"}); res.Text != "41" || res.Restarted {
			t.Fatalf("state after the timeout: %+v", res)
		}
	})

	t.Run("javascript", func(t *testing.T) {
		js, err := c.CreateContext(ctx, id, client.ContextRequest{Language: "javascript"})
		if err != nil {
			t.Fatal(err)
		}
		runCell(t, c, id, client.CodeRequest{ContextID: js.ID, Code: "let n = 20; const f = (a) => a * 2"})
		if res := runCell(t, c, id, client.CodeRequest{ContextID: js.ID, Code: "await Promise.resolve(f(n) + 2)"}); res.Text != "42" {
			t.Fatalf("javascript: %+v", res)
		}
		// The default JavaScript context is another one.
		if res := runCell(t, c, id, client.CodeRequest{Language: "javascript", Code: "typeof n"}); res.Text != "'undefined'" {
			t.Fatalf("default javascript context: %+v", res)
		}
	})

	t.Run("bash", func(t *testing.T) {
		runCell(t, c, id, client.CodeRequest{Language: "bash", Code: "V=42; mkdir -p d && cd d"})
		if res := runCell(t, c, id, client.CodeRequest{Language: "bash", Code: "echo $V $PWD"}); res.Stdout != "42 /workspace/d\n" {
			t.Fatalf("bash: %+v", res)
		}
		if res := runCell(t, c, id, client.CodeRequest{Language: "bash", Code: "false"}); res.Error == nil {
			t.Fatalf("bash false: no error")
		}
	})

	t.Run("big output capped", func(t *testing.T) {
		res := runCell(t, c, id, client.CodeRequest{Code: "import sys\nb = 'x' * (1 << 20)\nfor _ in range(50): sys.stdout.write(b)\nprint('done')", MaxOutput: 1 << 20})
		if !res.Truncated || len(res.Stdout) > 1<<20 || res.Error != nil {
			t.Fatalf("50 MB: truncated=%v stdout=%d error=%+v", res.Truncated, len(res.Stdout), res.Error)
		}
		if res := runCell(t, c, id, client.CodeRequest{Code: "x"}); res.Text != "41" {
			t.Fatalf("after big output: %+v", res)
		}
	})

	t.Run("stream and interrupt", func(t *testing.T) {
		st, err := c.RunCodeStream(ctx, id, client.CodeRequest{Code: "import time\nprint('tick', flush=True)\nwhile True: time.sleep(0.01)"})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		var types []string
		var eid string
		for {
			ev, err := st.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			types = append(types, ev.Type)
			switch ev.Type {
			case "start":
				eid = ev.ExecutionID
			case "stdout":
				if strings.Contains(ev.Text, "tick") && eid != "" {
					if err := c.InterruptCode(ctx, id, eid); err != nil {
						t.Fatal(err)
					}
					eid = ""
				}
			case "end":
				if ev.End.Error == nil || ev.End.Error.Name != "KeyboardInterrupt" {
					t.Fatalf("end: %+v", ev.End)
				}
			}
		}
		if types[0] != "start" || types[len(types)-1] != "end" {
			t.Fatalf("events: %v", types)
		}
		if res := runCell(t, c, id, client.CodeRequest{Code: "x"}); res.Text != "41" {
			t.Fatalf("after interrupt: %+v", res)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		list, err := c.Contexts(ctx, id)
		if err != nil || len(list) < 4 {
			t.Fatalf("contexts: %+v %v", list, err)
		}
		if err := c.RestartContext(ctx, id, "python"); err != nil {
			t.Fatal(err)
		}
		if res := runCell(t, c, id, client.CodeRequest{Code: "'x' in globals()"}); res.Text != "False" {
			t.Fatalf("after restart: %+v", res)
		}
		if err := c.DeleteContext(ctx, id, "python"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RunCode(ctx, id, client.CodeRequest{ContextID: "nope", Code: "1"}); client.StatusOf(err) != 404 {
			t.Fatalf("unknown context: %v", err)
		}
		if _, err := c.RunCode(ctx, id, client.CodeRequest{Language: "cobol", Code: "1"}); client.StatusOf(err) != 400 {
			t.Fatalf("unknown language: %v", err)
		}
		if err := c.InterruptCode(ctx, id, "nothing-running"); client.StatusOf(err) != 404 {
			t.Fatalf("interrupt of nothing: %v", err)
		}
	})
}

// TestCodeHostile runs a memory bomb and a fork bomb from a Python context
// in a sandbox with small limits: each ends as an error or a crash report,
// the server stays healthy and the next cell works.
func TestCodeHostile(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "alice")
	s := startServer(t, state)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{Limits: &client.Limits{MemoryBytes: 256 << 20, Pids: 64}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	runCell(t, c, id, client.CodeRequest{Code: "y = 7"})

	res := runCell(t, c, id, client.CodeRequest{Code: "blocks = []\nwhile True: blocks.append(bytearray(16 << 20))", Timeout: 30 * time.Second})
	if res.Error == nil || (res.Error.Name != "MemoryError" && res.Error.Name != "KernelDied") {
		t.Fatalf("memory bomb: %+v", res.Error)
	}
	t.Logf("memory bomb: %s: %s", res.Error.Name, res.Error.Value)
	next := runCell(t, c, id, client.CodeRequest{Code: "del blocks\n1 + 1"})
	if res.Error.Name == "KernelDied" {
		// The kernel was killed: the next cell runs in a fresh one and
		// is told so (blocks is gone).
		if !next.Restarted {
			t.Fatalf("the cell after a crash is not marked restarted: %+v", next)
		}
		next = runCell(t, c, id, client.CodeRequest{Code: "1 + 1"})
	}
	if next.Text != "2" {
		t.Fatalf("after the memory bomb: %+v", next)
	}

	res = runCell(t, c, id, client.CodeRequest{Code: "import os, time\npids = []\n" +
		"for _ in range(1000):\n    try:\n        pid = os.fork()\n    except OSError as e:\n        print('fork failed:', e.errno); break\n" +
		"    if pid == 0:\n        time.sleep(30); os._exit(0)\n    pids.append(pid)\nlen(pids)", Timeout: 30 * time.Second})
	if res.Error != nil {
		t.Logf("fork bomb ended with %s: %s", res.Error.Name, res.Error.Value)
	} else if !strings.Contains(res.Stdout, "fork failed") {
		t.Fatalf("fork bomb was not stopped by the pids limit: %+v", res)
	}
	runCell(t, c, id, client.CodeRequest{Code: "import signal\nfor p in pids: os.kill(p, signal.SIGKILL)\nfor p in pids: os.waitpid(p, 0)"})
	if res := runCell(t, c, id, client.CodeRequest{Code: "2 * 21"}); res.Text != "42" {
		t.Fatalf("after the fork bomb: %+v", res)
	}
	// The server is healthy: a new sandbox runs a cell.
	sb2, err := c.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res := runCell(t, c, sb2.ID, client.CodeRequest{Code: "1 + 1"}); res.Text != "2" {
		t.Fatalf("new sandbox: %+v", res)
	}
}
