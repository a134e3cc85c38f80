package agent_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/agent"
)

// cell runs code and collects it.
func cell(t *testing.T, c *agent.Client, req agent.CodeRequest) agent.Collected {
	t.Helper()
	cl, err := c.RunCode(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cl.Collect(ctxT(t), 1<<20)
	if err != nil {
		t.Fatalf("cell %q: %v", req.Code, err)
	}
	return out
}

func mainText(out agent.Collected) string {
	for _, r := range out.Results {
		if r.Main {
			return r.Data["text/plain"]
		}
	}
	return ""
}

// TestAgentCodeContexts runs cells in default and created contexts through
// the agent: state, the main result, errors, interrupts by id and by a
// dropped stream, restart and delete.
func TestAgentCodeContexts(t *testing.T) {
	ta := startAgent(t)
	c := ta.c
	if out := cell(t, c, agent.CodeRequest{Code: "x = 41\nprint('hi')"}); out.Stdout != "hi\n" || out.Error != nil || out.ContextID != "python" {
		t.Fatalf("first cell: %+v", out)
	}
	if out := cell(t, c, agent.CodeRequest{Code: "import os\nprint(os.environ.get(\"CELL_VAR\"))\nx + 1", Language: "python", Env: []string{"CELL_VAR=yes"}}); mainText(out) != "42" || out.Stdout != "yes\n" || out.ExecutionCount != 2 {
		t.Fatalf("x + 1: %+v", out)
	}
	if out := cell(t, c, agent.CodeRequest{Code: "1/0"}); out.Error == nil || out.Error.Name != "ZeroDivisionError" || len(out.Error.Traceback) == 0 {
		t.Fatalf("1/0: %+v", out)
	}
	// Interrupt by id.
	cl, err := c.RunCode(ctxT(t), agent.CodeRequest{ID: "spin-1", Code: "import time\nwhile True: time.sleep(0.01)"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			err := c.InterruptCode(context.Background(), "spin-1")
			var ae *agent.Error
			if err == nil || !errors.As(err, &ae) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	out, err := cl.Collect(ctxT(t), 1<<20)
	if err != nil || out.Error == nil || out.Error.Name != "KeyboardInterrupt" {
		t.Fatalf("interrupted cell: %+v %v", out, err)
	}
	if out := cell(t, c, agent.CodeRequest{Code: "x"}); mainText(out) != "41" {
		t.Fatalf("state after interrupt: %+v", out)
	}
	// A dropped stream interrupts the cell; the context stays usable.
	cl, err = c.RunCode(ctxT(t), agent.CodeRequest{Code: "while True: pass"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	cl.Close()
	if out := cell(t, c, agent.CodeRequest{Code: "x * 2"}); mainText(out) != "82" {
		t.Fatalf("after a dropped stream: %+v", out)
	}

	js, err := c.CreateContext(ctxT(t), agent.ContextRequest{Language: "javascript"})
	if err != nil {
		t.Fatal(err)
	}
	cell(t, c, agent.CodeRequest{ContextID: js.ID, Code: "let a = 20"})
	if out := cell(t, c, agent.CodeRequest{ContextID: js.ID, Code: "a + 1"}); mainText(out) != "21" {
		t.Fatalf("js: %+v", out)
	}
	sh, err := c.CreateContext(ctxT(t), agent.ContextRequest{Language: "bash", Env: []string{"GREETING=hello"}})
	if err != nil {
		t.Fatal(err)
	}
	cell(t, c, agent.CodeRequest{ContextID: sh.ID, Code: "V=7; mkdir -p sub; cd sub"})
	if out := cell(t, c, agent.CodeRequest{ContextID: sh.ID, Code: "echo $GREETING $V $(basename $PWD)"}); out.Stdout != "hello 7 sub\n" {
		t.Fatalf("bash: %+v", out)
	}
	// The host names the language it gated: a context of another one
	// refuses the cell (and runs nothing); CellLanguage reports the
	// context's.
	if l, err := c.CellLanguage(ctxT(t), agent.CodeRequest{ContextID: sh.ID, Language: "python"}); err != nil || l != "bash" {
		t.Fatalf("CellLanguage of the bash context: %q %v", l, err)
	}
	if _, err := c.CellLanguage(ctxT(t), agent.CodeRequest{ContextID: "ctx-none"}); !isAgentCode(err, agent.CodeNotFound) {
		t.Fatalf("CellLanguage of no context: %v", err)
	}
	if l, _ := c.CellLanguage(ctxT(t), agent.CodeRequest{Language: "SH"}); l != "bash" {
		t.Fatalf("CellLanguage of SH: %q", l)
	}
	cl, err = c.RunCode(ctxT(t), agent.CodeRequest{ContextID: sh.ID, Language: "python", Code: "V=8"})
	if err == nil {
		_, err = cl.Collect(ctxT(t), 1<<20)
	}
	if !isAgentCode(err, agent.CodeInvalidArgument) {
		t.Fatalf("a python cell in the bash context: %v", err)
	}
	if out := cell(t, c, agent.CodeRequest{ContextID: sh.ID, Language: "sh", Code: "echo $V"}); out.Stdout != "7\n" {
		t.Fatalf("bash after the refused cell: %+v", out)
	}
	list, err := c.Contexts(ctxT(t))
	if err != nil || len(list) != 3 {
		t.Fatalf("contexts: %+v %v", list, err)
	}
	if err := c.RestartContext(ctxT(t), js.ID); err != nil {
		t.Fatal(err)
	}
	if out := cell(t, c, agent.CodeRequest{ContextID: js.ID, Code: "typeof a"}); !strings.Contains(mainText(out), "undefined") {
		t.Fatalf("js after restart: %+v", out)
	}
	if err := c.DeleteContext(ctxT(t), js.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunCode(ctxT(t), agent.CodeRequest{ContextID: js.ID, Code: "1"}); err != nil {
		t.Fatal(err)
	}
	cl, _ = c.RunCode(ctxT(t), agent.CodeRequest{ContextID: js.ID, Code: "1"})
	if _, err := cl.Wait(ctxT(t)); !errors.Is(err, &agent.Error{Code: agent.CodeNotFound}) {
		t.Fatalf("cell in a deleted context: %v", err)
	}
}

// isAgentCode reports whether err is an *agent.Error of code.
func isAgentCode(err error, code string) bool {
	var ae *agent.Error
	return errors.As(err, &ae) && ae.Code == code
}

// TestDefaultContextCwd: a cell that starts a language's default context
// starts it in the request's Cwd (relative to the home), which the context
// keeps; a context already running keeps its own directory.
func TestDefaultContextCwd(t *testing.T) {
	ta := startAgent(t)
	sub := ta.home + "/sub"
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	out := cell(t, ta.c, agent.CodeRequest{Code: "import os\nos.getcwd()", Language: "python", Cwd: "sub"})
	if got := mainText(out); got != "'"+sub+"'" {
		t.Fatalf("a default context started with Cwd sub is in %s, want %s (%+v)", got, sub, out)
	}
	out = cell(t, ta.c, agent.CodeRequest{Code: "os.getcwd()", Language: "python", Cwd: "elsewhere"})
	if got := mainText(out); got != "'"+sub+"'" || out.Error != nil {
		t.Fatalf("the running default context moved to %s (%+v)", got, out)
	}
	list, err := ta.c.Contexts(ctxT(t))
	if err != nil || len(list) != 1 || list[0].Cwd != sub {
		t.Fatalf("contexts: %+v %v", list, err)
	}
}
