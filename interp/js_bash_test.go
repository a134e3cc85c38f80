package interp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/interp"
)

func javascript(t testing.TB) *interp.Kernel {
	return start(t, interp.Config{Language: interp.JavaScript, KillAfter: 2 * time.Second})
}

func TestJavaScriptStatePersists(t *testing.T) {
	t.Parallel()
	k := javascript(t)
	if res := ok(t, k, "let a = 1"); len(res.Results) != 0 {
		t.Errorf("let a = 1 returned %v", res.Results)
	}
	if got := plain(t, ok(t, k, "a + 1")); got != "2" {
		t.Errorf("a + 1 = %s, want 2", got)
	}
	if got := plain(t, ok(t, k, "await new Promise(r => setTimeout(() => r(5), 10))")); got != "5" {
		t.Errorf("awaited %s, want 5", got)
	}
	// Declarations in cells with top-level await persist too.
	ok(t, k, "const b = await Promise.resolve(3)\nfunction triple(v) { return 3 * v }\nclass K { get v() { return 7 } }\nvar c = 4")
	if got := plain(t, ok(t, k, "[a, b, triple(b), new K().v, c]")); got != "[ 1, 3, 9, 7, 4 ]" {
		t.Errorf("got %s", got)
	}
	if got := plain(t, ok(t, k, "{x: 1}")); got != "{ x: 1 }" {
		t.Errorf("object literal: %s", got)
	}
	res := ok(t, k, "console.log('out'); console.error('err'); 'str'")
	if res.Stdout != "out\n" || res.Stderr != "err\n" || plain(t, res) != "'str'" {
		t.Errorf("console: %+v", res)
	}
	if got := plain(t, ok(t, k, "require('path').join('a', 'b') + ' ' + typeof fs.readFileSync")); got != "'a/b function'" {
		t.Errorf("require: %s", got)
	}
	if got := plain(t, ok(t, k, "(await import('node:os')).platform()")); got != "'linux'" {
		t.Errorf("import(): %s", got)
	}
}

func TestJavaScriptErrors(t *testing.T) {
	t.Parallel()
	k := javascript(t)
	e := wantError(t, run(t, k, "nope + 1", 0), "ReferenceError")
	tb := strings.Join(e.Traceback, "\n")
	if e.Value != "nope is not defined" || !strings.Contains(tb, "<cell-1>") || strings.Contains(tb, "airlock-kernel") || strings.Contains(tb, "node:vm") {
		t.Errorf("value %q, traceback:\n%s", e.Value, tb)
	}
	e = wantError(t, run(t, k, "await Promise.reject(new TypeError('async bad'))", 0), "TypeError")
	if e.Value != "async bad" {
		t.Errorf("async rejection: %v", e)
	}
	wantError(t, run(t, k, "let = = 2", 0), "SyntaxError")
	e = wantError(t, run(t, k, "throw 5", 0), "Error")
	if !strings.Contains(e.Value, "5") {
		t.Errorf("throw 5: %v", e)
	}
	// An exception thrown later in a callback does not kill the kernel.
	res := ok(t, k, "setTimeout(() => { throw new Error('later') }, 1); await new Promise(r => setTimeout(r, 20)); 1")
	if res.Restarted || !strings.Contains(res.Stderr, "later") {
		t.Errorf("after an uncaught exception: %+v", res)
	}
}

func TestJavaScriptTimeoutKeepsState(t *testing.T) {
	t.Parallel()
	k := javascript(t)
	ok(t, k, "let a = 1")
	wantError(t, run(t, k, "while (true) {}", time.Second), "TimeoutError")
	if res := ok(t, k, "a"); plain(t, res) != "1" || res.Restarted {
		t.Errorf("after the timeout: %+v", res)
	}
	// A cell waiting on a promise that never settles is interrupted too.
	done := startedCell(t, k, context.Background(), "console.log('started'); await new Promise(() => {})")
	if err := k.Interrupt(); err != nil {
		t.Fatal(err)
	}
	o := <-done
	wantError(t, o.res, "KeyboardInterrupt")
	if res := ok(t, k, "a + 1"); plain(t, res) != "2" || res.Restarted {
		t.Errorf("after the interrupt: %+v", res)
	}
}

func TestJavaScriptSpinAfterAwaitRestarts(t *testing.T) {
	t.Parallel()
	k := start(t, interp.Config{Language: interp.JavaScript, KillAfter: time.Second})
	ok(t, k, "let a = 1")
	// node cannot interrupt code running from the microtask queue: the
	// kernel is killed, and says so.
	e := wantError(t, run(t, k, "await null; while (true) {}", 500*time.Millisecond), "TimeoutError")
	if !strings.Contains(e.Value, "killed") || !strings.Contains(e.Value, "state is lost") {
		t.Errorf("message %q", e.Value)
	}
	res := run(t, k, "typeof a", 0)
	if !res.Restarted || plain(t, res) != "'undefined'" {
		t.Errorf("after the kill: %+v", res)
	}
}

func TestJavaScriptInterruptSyncCodeRestarts(t *testing.T) {
	t.Parallel()
	k := start(t, interp.Config{Language: interp.JavaScript, KillAfter: time.Second})
	ok(t, k, "let a = 1")
	// Without a timeout, synchronous code cannot be interrupted: the
	// kernel is killed, and the error says so.
	done := startedCell(t, k, context.Background(), "console.log('started'); for (;;) {}")
	if err := k.Interrupt(); err != nil {
		t.Fatal(err)
	}
	o := <-done
	e := wantError(t, o.res, "KeyboardInterrupt")
	if !strings.Contains(e.Value, "state is lost") {
		t.Errorf("message %q", e.Value)
	}
	if res := run(t, k, "typeof a", 0); !res.Restarted || plain(t, res) != "'undefined'" {
		t.Errorf("after the kill: %+v", res)
	}
}

func TestJavaScriptCrash(t *testing.T) {
	t.Parallel()
	k := javascript(t)
	e := wantError(t, run(t, k, "process.exit(4)", 0), "KernelDied")
	if !strings.Contains(e.Value, "exit status 4") {
		t.Errorf("crash: %q", e.Value)
	}
	if res := ok(t, k, "1"); !res.Restarted {
		t.Error("Restarted not set")
	}
}

func bash(t testing.TB) *interp.Kernel {
	return start(t, interp.Config{Language: interp.Bash, KillAfter: 2 * time.Second})
}

func TestBashStatePersists(t *testing.T) {
	t.Parallel()
	k := bash(t)
	ok(t, k, "X=5; cd /tmp")
	if res := ok(t, k, "echo $X; pwd"); res.Stdout != "5\n/tmp\n" {
		t.Errorf("stdout %q, want \"5\\n/tmp\\n\"", res.Stdout)
	}
	ok(t, k, "declare -A m=([k]=v); greet() { echo \"hi $1\"; }; alias ll='echo listed'")
	if res := ok(t, k, "echo ${m[k]}; greet you; ll"); res.Stdout != "v\nhi you\nlisted\n" {
		t.Errorf("stdout %q", res.Stdout)
	}
	// Quoting survives: quotes, backslashes, newlines, control characters,
	// history characters, UTF-8.
	code := "printf '%s\\n' \"it's\" 'a\\b' \"x!y\" $'tab\\tend' 'naïve ✓'\ncat <<'EOF'\nline 1\n  line 2\nEOF"
	if res := ok(t, k, code); res.Stdout != "it's\na\\b\nx!y\ntab\tend\nnaïve ✓\nline 1\n  line 2\n" {
		t.Errorf("stdout %q", res.Stdout)
	}
	// stdin is at EOF.
	if res := ok(t, k, "read -r line; echo \"rc=$?\""); res.Stdout != "rc=1\n" {
		t.Errorf("read: %q", res.Stdout)
	}
}

func TestBashStatusAndInterrupt(t *testing.T) {
	t.Parallel()
	k := bash(t)
	e := wantError(t, run(t, k, "echo out; (exit 3)", 0), "ExitStatus")
	if e.Value != "exit status 3" {
		t.Errorf("value %q", e.Value)
	}
	ok(t, k, "X=5")
	// ^C stops the whole cell, however deep: loops inside functions,
	// foreground commands, pipelines.
	for _, code := range []string{
		"while :; do :; done; echo after",
		"f() { while :; do :; done; echo in-f; }; g() { f; echo in-g; }; g; echo after",
		"sleep 60; echo after",
		"sleep 60 | cat; echo after",
	} {
		res := run(t, k, code, 500*time.Millisecond)
		wantError(t, res, "TimeoutError")
		if strings.Contains(res.Stdout, "after") || strings.Contains(res.Stdout, "in-") {
			t.Errorf("%q went on after the interrupt: %q", code, res.Stdout)
		}
	}
	if res := ok(t, k, "echo $X"); res.Stdout != "5\n" || res.Restarted {
		t.Errorf("after interrupts: %+v", res)
	}
	// exit ends the shell: a crash, then a fresh shell.
	wantError(t, run(t, k, "exit 3", 0), "KernelDied")
	if res := ok(t, k, "echo \"${X:-unset}\""); !res.Restarted || res.Stdout != "unset\n" {
		t.Errorf("after exit: %+v", res)
	}
	if _, err := k.Execute(context.Background(), "echo a\x00b", 0, 0, nil); err == nil {
		t.Error("a NUL byte was accepted")
	}
}
