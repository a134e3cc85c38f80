package interp_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image/png"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/interp"
)

// raceEnabled is set under the race detector, whose instrumentation
// allocates.
var raceEnabled bool

// start starts a kernel for a test, skipping the test if the interpreter is
// missing, and closes it at the end.
func start(t testing.TB, cfg interp.Config) *interp.Kernel {
	t.Helper()
	path := map[interp.Language]string{
		interp.Python: interp.DefaultPython, interp.JavaScript: interp.DefaultNode, interp.TypeScript: interp.DefaultNode,
		interp.Bash: interp.DefaultBash,
	}[cfg.Language]
	if _, err := os.Stat(path); err != nil {
		t.Skipf("no %s interpreter: %v", cfg.Language, err)
	}
	k, err := interp.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Start(%s): %v", cfg.Language, err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// run executes a cell that must not fail at the Go level.
func run(t testing.TB, k *interp.Kernel, code string, timeout time.Duration) *interp.ExecResult {
	t.Helper()
	res, err := k.Execute(context.Background(), code, timeout, 0, nil)
	if err != nil {
		t.Fatalf("Execute(%q): %v", code, err)
	}
	return res
}

// ok executes a cell that must succeed.
func ok(t testing.TB, k *interp.Kernel, code string) *interp.ExecResult {
	t.Helper()
	res := run(t, k, code, 30*time.Second)
	if res.Error != nil {
		t.Fatalf("Execute(%q): cell failed: %v\n%s\nstderr: %s", code, res.Error, strings.Join(res.Error.Traceback, "\n"), res.Stderr)
	}
	return res
}

// plain returns the text/plain of the cell's only result.
func plain(t testing.TB, res *interp.ExecResult) string {
	t.Helper()
	if len(res.Results) != 1 {
		t.Fatalf("got %d results, want 1: %+v", len(res.Results), res.Results)
	}
	return res.Results[0]["text/plain"]
}

func wantError(t testing.TB, res *interp.ExecResult, name string) *interp.ExecError {
	t.Helper()
	if res.Error == nil {
		t.Fatalf("cell succeeded, want %s (stdout %q, stderr %q)", name, res.Stdout, res.Stderr)
	}
	if res.Error.Name != name {
		t.Fatalf("error %v, want %s\n%s", res.Error, name, strings.Join(res.Error.Traceback, "\n"))
	}
	return res.Error
}

func python(t testing.TB) *interp.Kernel {
	return start(t, interp.Config{Language: interp.Python})
}

// needModules skips a test when Debian's python3 lacks the data modules.
func needModules(t testing.TB, mods ...string) {
	t.Helper()
	args := []string{"-c", "import " + strings.Join(mods, ", ")}
	if out, err := exec.Command(interp.DefaultPython, args...).CombinedOutput(); err != nil {
		t.Skipf("python3 cannot import %v: %v\n%s", mods, err, out)
	}
}

func TestPythonStatePersists(t *testing.T) {
	t.Parallel()
	k := python(t)
	if res := ok(t, k, "x = 41"); len(res.Results) != 0 || res.ExecutionCount != 1 {
		t.Errorf("x = 41: results %v, count %d", res.Results, res.ExecutionCount)
	}
	res := ok(t, k, "x + 1")
	if got := plain(t, res); got != "42" {
		t.Errorf("x + 1 = %q, want 42", got)
	}
	if res.ExecutionCount != 2 {
		t.Errorf("execution count %d, want 2", res.ExecutionCount)
	}
	// Functions, imports and the working directory persist too.
	ok(t, k, "import os\ndef double(v):\n    return 2 * v\nos.chdir('/tmp')")
	if got := plain(t, ok(t, k, "double(x), os.getcwd()")); got != "(82, '/tmp')" {
		t.Errorf("got %s", got)
	}
}

func TestPythonMatplotlibPNG(t *testing.T) {
	t.Parallel()
	needModules(t, "matplotlib")
	k := python(t)
	res := ok(t, k, `import matplotlib.pyplot as plt
fig = plt.figure(figsize=(4, 3), dpi=100)
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
print("after show")
plt.figure(figsize=(2, 1), dpi=50)
plt.bar(["a", "b"], [1, 2])
len(plt.get_fignums())`)
	// The shown figure, the value (1 open figure: the first was closed by
	// show), then the figure left open.
	if len(res.Results) != 3 {
		t.Fatalf("got %d results, want 3: %v", len(res.Results), keys(res.Results))
	}
	checkPNG(t, res.Results[0], 400, 300)
	if got := res.Results[1]["text/plain"]; got != "1" {
		t.Errorf("open figures after show: %s, want 1", got)
	}
	checkPNG(t, res.Results[2], 100, 50)
	if res.Stdout != "after show\n" {
		t.Errorf("stdout %q", res.Stdout)
	}
	// Every figure was closed: the next cell returns none.
	if res := ok(t, k, "plt.get_fignums()"); plain(t, res) != "[]" {
		t.Errorf("figures left after the cell: %s", plain(t, res))
	}
}

func keys(bundles []map[string]string) [][]string {
	var out [][]string
	for _, b := range bundles {
		var ks []string
		for k := range b {
			ks = append(ks, k)
		}
		out = append(out, ks)
	}
	return out
}

func checkPNG(t *testing.T, bundle map[string]string, w, h int) {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(bundle["image/png"])
	if err != nil {
		t.Fatalf("image/png is not base64: %v", err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("image/png does not start with the PNG signature: %q", b[:min(len(b), 8)])
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("decoding the PNG: %v", err)
	}
	if got := img.Bounds().Size(); got.X != w || got.Y != h {
		t.Errorf("PNG is %dx%d, want %dx%d", got.X, got.Y, w, h)
	}
	if !strings.HasPrefix(bundle["text/plain"], "<Figure size") {
		t.Errorf("figure text/plain %q", bundle["text/plain"])
	}
}

func TestPythonDataFrame(t *testing.T) {
	t.Parallel()
	needModules(t, "pandas", "numpy")
	k := python(t)
	res := ok(t, k, `import pandas as pd
df = pd.DataFrame({"alpha": [1, 2, 3], "beta": ["x", "y", "z"]})
df`)
	b := res.Results[0]
	html := b["text/html"]
	if !strings.Contains(html, "<table") || !strings.Contains(html, "alpha") || !strings.Contains(html, "beta") {
		t.Errorf("text/html lacks the table or its columns: %q", html)
	}
	var split struct {
		Columns []string `json:"columns"`
		Data    [][]any  `json:"data"`
	}
	if err := json.Unmarshal([]byte(b["application/json"]), &split); err != nil {
		t.Fatalf("application/json: %v: %q", err, b["application/json"])
	}
	if strings.Join(split.Columns, ",") != "alpha,beta" || len(split.Data) != 3 {
		t.Errorf("application/json %+v", split)
	}
	if !strings.Contains(b["text/plain"], "alpha") {
		t.Errorf("text/plain %q", b["text/plain"])
	}
}

func TestPythonRichRepr(t *testing.T) {
	t.Parallel()
	k := python(t)
	res := ok(t, k, `class Shape:
    def _repr_svg_(self):
        return '<svg xmlns="http://www.w3.org/2000/svg"/>'
    def _repr_html_(self):
        return '<b>shape</b>'
    def _repr_markdown_(self):
        return '**shape**'
    def _repr_json_(self):
        return {"kind": "shape"}
    def __repr__(self):
        return 'Shape()'
Shape()`)
	want := map[string]string{
		"image/svg+xml":    `<svg xmlns="http://www.w3.org/2000/svg"/>`,
		"text/html":        "<b>shape</b>",
		"text/markdown":    "**shape**",
		"application/json": `{"kind": "shape"}`,
		"text/plain":       "Shape()",
	}
	for mime, v := range want {
		if got := res.Results[0][mime]; got != v {
			t.Errorf("%s = %q, want %q", mime, got, v)
		}
	}
	// A value of None shows nothing; display() shows at once, in order.
	var seq []string
	res2, err := k.Execute(context.Background(), "print('a'); display(Shape()); print('b'); None", 0, 0, func(o interp.Output) {
		if n := len(seq); n > 0 && strings.HasPrefix(seq[n-1], o.Type+":") {
			seq[n-1] += o.Text // print writes the newline separately
			return
		}
		seq = append(seq, o.Type+":"+o.Text)
	})
	if err != nil || res2.Error != nil {
		t.Fatalf("display: %v %v", err, res2.Error)
	}
	if got := strings.Join(seq, " "); got != "stdout:a\n result:Shape() stdout:b\n" {
		t.Errorf("outputs in order %q", got)
	}
}

func TestPythonErrors(t *testing.T) {
	t.Parallel()
	k := python(t)
	e := wantError(t, run(t, k, "1/0", 0), "ZeroDivisionError")
	tb := strings.Join(e.Traceback, "\n")
	if e.Value != "division by zero" || !strings.Contains(tb, `File "<cell-1>", line 1`) || !strings.Contains(tb, "1/0") {
		t.Errorf("value %q, traceback:\n%s", e.Value, tb)
	}
	if strings.Contains(tb, "airlock-kernel") || strings.Contains(tb, "<string>") {
		t.Errorf("traceback shows kernel frames:\n%s", tb)
	}
	// A nested call shows the cell's frames, including functions of
	// earlier cells.
	ok(t, k, "def f(v):\n    return g(v)\ndef g(v):\n    raise ValueError(f'bad {v}')")
	e = wantError(t, run(t, k, "f(3)", 0), "ValueError")
	if tb := strings.Join(e.Traceback, "\n"); e.Value != "bad 3" || !strings.Contains(tb, "<cell-2>") || !strings.Contains(tb, "in g") {
		t.Errorf("value %q, traceback:\n%s", e.Value, tb)
	}
	e = wantError(t, run(t, k, "def broken(:\n  pass", 0), "SyntaxError")
	if tb := strings.Join(e.Traceback, "\n"); strings.Contains(tb, "airlock-kernel") || !strings.Contains(tb, "<cell-4>") {
		t.Errorf("syntax error traceback:\n%s", tb)
	}
	// exit() ends the cell, not the kernel; stdin is at EOF.
	if e := wantError(t, run(t, k, "exit(3)", 0), "SystemExit"); e.Value != "3" {
		t.Errorf("exit(3): %v", e)
	}
	wantError(t, run(t, k, "input()", 0), "EOFError")
	if res := ok(t, k, "'still here'"); plain(t, res) != "'still here'" || res.Restarted {
		t.Errorf("after errors: %+v", res)
	}
}

func TestPythonTopLevelAwait(t *testing.T) {
	t.Parallel()
	k := python(t)
	ok(t, k, "import asyncio\nasync def later(v):\n    await asyncio.sleep(0.01)\n    return v")
	if got := plain(t, ok(t, k, "v = await later(5)\nv * 2")); got != "10" {
		t.Errorf("got %s", got)
	}
	if got := plain(t, ok(t, k, "v")); got != "5" {
		t.Errorf("v = %s", got)
	}
}

func TestPythonTimeoutKeepsState(t *testing.T) {
	t.Parallel()
	k := python(t)
	ok(t, k, "x = 41")
	res := run(t, k, "while True: pass", time.Second)
	e := wantError(t, res, "TimeoutError")
	if !strings.Contains(e.Value, "timeout of 1s") {
		t.Errorf("timeout message %q", e.Value)
	}
	res = ok(t, k, "x + 1")
	if plain(t, res) != "42" || res.Restarted {
		t.Errorf("after the timeout: %+v", res)
	}
	// A subprocess holding up the cell is stopped as well.
	wantError(t, run(t, k, "import subprocess\nsubprocess.run(['sleep', '60'])", time.Second), "TimeoutError")
	wantError(t, run(t, k, "import os\nos.system('sleep 60')", time.Second), "TimeoutError")
	if res := ok(t, k, "x"); plain(t, res) != "41" || res.Restarted {
		t.Errorf("after subprocess timeouts: %+v", res)
	}
}

// startedCell runs a cell in the background and returns once it has printed
// "started".
func startedCell(t *testing.T, k *interp.Kernel, ctx context.Context, code string) <-chan execOutcome {
	t.Helper()
	started := make(chan struct{})
	var once sync.Once
	done := make(chan execOutcome, 1)
	go func() {
		res, err := k.Execute(ctx, code, 0, 0, func(o interp.Output) {
			if strings.Contains(o.Text, "started") {
				once.Do(func() { close(started) })
			}
		})
		done <- execOutcome{res, err}
	}()
	select {
	case <-started:
	case o := <-done:
		t.Fatalf("cell ended before starting: %+v %v", o.res, o.err)
	}
	return done
}

type execOutcome struct {
	res *interp.ExecResult
	err error
}

func TestPythonInterrupt(t *testing.T) {
	t.Parallel()
	k := python(t)
	ok(t, k, "x = 1")
	done := startedCell(t, k, context.Background(), "import time\nprint('started', flush=True)\ntime.sleep(60)")
	if err := k.Interrupt(); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	e := wantError(t, o.res, "KeyboardInterrupt")
	if tb := strings.Join(e.Traceback, "\n"); !strings.Contains(tb, "<cell-2>") || !strings.HasSuffix(tb, "KeyboardInterrupt") {
		t.Errorf("traceback:\n%s", tb)
	}
	if res := ok(t, k, "x"); plain(t, res) != "1" || res.Restarted {
		t.Errorf("after the interrupt: %+v", res)
	}
	// Interrupting an idle kernel is harmless.
	if err := k.Interrupt(); err != nil {
		t.Fatal(err)
	}
	if res := ok(t, k, "x + 1"); plain(t, res) != "2" {
		t.Errorf("after an idle interrupt: %+v", res)
	}
}

func TestCancelInterruptsCell(t *testing.T) {
	t.Parallel()
	k := python(t)
	ok(t, k, "x = 1")
	ctx, cancel := context.WithCancel(context.Background())
	done := startedCell(t, k, ctx, "import time\nprint('started', flush=True)\ntime.sleep(60)")
	cancel()
	o := <-done
	if !errors.Is(o.err, context.Canceled) {
		t.Errorf("Execute error %v, want context.Canceled", o.err)
	}
	wantError(t, o.res, "KeyboardInterrupt")
	if res := ok(t, k, "x"); plain(t, res) != "1" {
		t.Errorf("after the cancel: %+v", res)
	}
}

func TestPythonCrashRestarts(t *testing.T) {
	t.Parallel()
	k := python(t)
	ok(t, k, "x = 1")
	res := run(t, k, "import os\nprint('bye', flush=True)\nos._exit(1)", 0)
	e := wantError(t, res, "KernelDied")
	if !strings.Contains(e.Value, "exit status 1") || res.Stdout != "bye\n" {
		t.Errorf("crash: %q, stdout %q", e.Value, res.Stdout)
	}
	res = ok(t, k, "1 + 1")
	if !res.Restarted || plain(t, res) != "2" || res.ExecutionCount != 1 {
		t.Errorf("after the crash: %+v", res)
	}
	wantError(t, run(t, k, "x", 0), "NameError") // fresh state
	if res := ok(t, k, "2"); res.Restarted {
		t.Error("Restarted set again on the following cell")
	}
	// A segfault.
	e = wantError(t, run(t, k, "import ctypes\nctypes.string_at(0)", 0), "KernelDied")
	if !strings.Contains(e.Value, "segmentation fault") {
		t.Errorf("segfault: %q", e.Value)
	}
	if res := ok(t, k, "3"); !res.Restarted {
		t.Error("Restarted not set after the segfault")
	}
}

func TestKernelDiesBetweenCells(t *testing.T) {
	t.Parallel()
	k := python(t)
	ok(t, k, "import os, threading\nthreading.Timer(0.05, lambda: os._exit(3)).start()")
	time.Sleep(200 * time.Millisecond) // let it die while idle
	res := ok(t, k, "'fresh'")
	if !res.Restarted {
		t.Errorf("Restarted not set: %+v", res)
	}
}

func TestOutputCapBoundsMemory(t *testing.T) {
	// Not parallel: it measures this process's memory.
	k := python(t)
	ok(t, k, "import sys")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var emitted int
	res, err := k.Execute(context.Background(),
		"for _ in range(50):\n    sys.stdout.write('x' * (1 << 20))\nprint('done', file=sys.stderr)\n7",
		0, 1<<20, func(o interp.Output) {
			if o.Type == "stdout" || o.Type == "stderr" {
				emitted += len(o.Text)
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if res.Error != nil {
		t.Fatalf("cell failed: %v", res.Error)
	}
	if !res.Truncated || len(res.Stdout) != 1<<20 || res.Stderr != "" {
		t.Errorf("truncated %v, stdout %d bytes, stderr %q; want the first MiB of stdout only", res.Truncated, len(res.Stdout), res.Stderr)
	}
	if emitted != 1<<20 {
		t.Errorf("emitted %d bytes, want %d", emitted, 1<<20)
	}
	if plain(t, res) != "7" {
		t.Errorf("the cell did not run to its end: %+v", res.Results)
	}
	// Generous bounds, far below the 50 MiB printed: the data must
	// stream through, not accumulate (not even as garbage).
	const mb = 1 << 20
	alloc := after.TotalAlloc - before.TotalAlloc
	inuse := int64(after.HeapInuse) - int64(before.HeapInuse)
	sys := int64(after.Sys) - int64(before.Sys)
	t.Logf("allocated %.1f MiB, heap in use %+.1f MiB, sys %+.1f MiB", float64(alloc)/mb, float64(inuse)/mb, float64(sys)/mb)
	if raceEnabled {
		alloc = 0
	}
	if alloc > 20*mb || inuse > 16*mb || sys > 24*mb {
		t.Errorf("memory grew: allocated %d, heap in use %+d, sys %+d bytes", alloc, inuse, sys)
	}
}

func TestRestartAndClose(t *testing.T) {
	t.Parallel()
	k := python(t)
	ok(t, k, "x = 1")
	if err := k.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := run(t, k, "x", 0)
	wantError(t, res, "NameError")
	if res.Restarted || res.ExecutionCount != 1 {
		t.Errorf("after Restart: restarted %v, count %d", res.Restarted, res.ExecutionCount)
	}
	// Restart during a cell ends it.
	done := startedCell(t, k, context.Background(), "import time\nprint('started', flush=True)\ntime.sleep(60)")
	if err := k.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	o := <-done
	wantError(t, o.res, "KernelRestarted")
	ok(t, k, "1")
	// Close during a cell ends it with ErrClosed.
	done = startedCell(t, k, context.Background(), "import time\nprint('started', flush=True)\ntime.sleep(60)")
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if o := <-done; !errors.Is(o.err, interp.ErrClosed) {
		t.Errorf("Execute during Close: %v", o.err)
	}
	if _, err := k.Execute(context.Background(), "1", 0, 0, nil); !errors.Is(err, interp.ErrClosed) {
		t.Errorf("Execute after Close: %v", err)
	}
	if err := k.Interrupt(); !errors.Is(err, interp.ErrClosed) {
		t.Errorf("Interrupt after Close: %v", err)
	}
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	if _, err := interp.Start(context.Background(), interp.Config{Language: "cobol"}); err == nil {
		t.Error("unknown language accepted")
	}
	if _, err := interp.Start(context.Background(), interp.Config{Language: interp.Python, Python: "/nonexistent/python3"}); err == nil {
		t.Error("missing interpreter accepted")
	}
	// An interpreter that exits at once: the error says how.
	_, err := interp.Start(context.Background(), interp.Config{Language: interp.Python, Python: "/bin/false"})
	if err == nil || !strings.Contains(err.Error(), "exit status 1") {
		t.Errorf("Start with /bin/false: %v", err)
	}
}

func TestConcurrentExecuteQueues(t *testing.T) {
	t.Parallel()
	k := python(t)
	ok(t, k, "n = 0")
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, err := k.Execute(context.Background(), "n += 1", 0, 0, nil); err != nil || res.Error != nil {
				t.Errorf("n += 1: %v %v", err, res.Error)
			}
		}()
	}
	wg.Wait()
	if got := plain(t, ok(t, k, "n")); got != "8" {
		t.Errorf("n = %s, want 8", got)
	}
}
