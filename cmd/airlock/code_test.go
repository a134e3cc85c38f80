package main

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunCode: one-shot cells in each language print their output and the
// value of the last expression; --json gives the whole result.
func TestRunCode(t *testing.T) {
	out, errOut, code := runCLI(t, nil, "run", "--code", "x = 20\nprint('side')\nx * 2 + 2", "--language", "python")
	if code != 0 || !strings.Contains(out, "side") || !strings.Contains(out, "42") {
		t.Fatalf("python: code %d out %q err %q", code, out, errOut)
	}
	out, _, code = runCLI(t, nil, "run", "--code", "const a = [1,2,3]; a.map(x => x * 2)", "--language", "javascript")
	if code != 0 || !strings.Contains(out, "2") || !strings.Contains(out, "6") {
		t.Fatalf("javascript: code %d out %q", code, out)
	}
	out, _, code = runCLI(t, nil, "run", "--code", "X=5; echo $((X*2))", "--language", "bash")
	if code != 0 || strings.TrimSpace(out) != "10" {
		t.Fatalf("bash: code %d out %q", code, out)
	}
	out, _, code = runCLI(t, nil, "run", "--json", "--code", "1/0", "--language", "python")
	var res struct {
		Error *struct{ Name string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Error == nil || res.Error.Name != "ZeroDivisionError" || code == 0 {
		t.Fatalf("1/0: code %d out %q (%v)", code, out, err)
	}
}

// TestRunCodeSources: --code - reads the cell from stdin, --code @FILE
// from a file, and figures are saved like airlock shell saves them.
func TestRunCodeSources(t *testing.T) {
	dir := t.TempDir()
	run := func(stdin string, args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(airlockBin(t), args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}
		cmd.Stdin = strings.NewReader(stdin)
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v: %v (stdout %q, stderr %q)", args, err, o.String(), e.String())
		}
		return o.String(), e.String()
	}
	if out, _ := run("x = 6\nx * 7\n", "run", "--code", "-"); strings.TrimSpace(out) != "42" {
		t.Errorf("--code -: %q", out)
	}
	if err := os.WriteFile(filepath.Join(dir, "cell.py"), []byte("import math\nmath.factorial(5)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := run("", "run", "--code", "@cell.py"); strings.TrimSpace(out) != "120" {
		t.Errorf("--code @cell.py: %q", out)
	}
	out, _ := run("", "run", "--code", "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
	png, err := os.ReadFile(filepath.Join(dir, "cell-1-1.png"))
	if err != nil || !strings.HasPrefix(string(png), "\x89PNG") || !strings.Contains(out, "saved to cell-1-1.png") {
		t.Errorf("figure: %v, %d bytes, output %q", err, len(png), out)
	}
}

// TestShell: `airlock shell` against a real server keeps state between
// blocks read from a pipe, and kills its sandbox at the end.
func TestShell(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for the server's cgroups")
	}
	bin := airlockBin(t)
	state := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	srv := exec.Command(bin, "serve", "--listen", addr, "--state-dir", state, "--no-auth")
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Signal(os.Interrupt); srv.Wait() }()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("server did not start")
		}
	}
	sh := exec.Command(bin, "shell", "--url", "http://"+addr)
	sh.Dir = t.TempDir()
	sh.Stdin = strings.NewReader("x = 41\n\nx + 1\n\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n")
	outb, err := sh.CombinedOutput()
	out := string(outb)
	if err != nil || !strings.Contains(out, "42") {
		t.Fatalf("shell: %v %q", err, out)
	}
	pngs, _ := filepath.Glob(filepath.Join(sh.Dir, "*.png"))
	if len(pngs) != 1 {
		t.Fatalf("want one saved figure, got %v (output %q)", pngs, out)
	}
	// The shell's sandbox is gone: the server lists no running sandbox.
	resp, err := exec.Command("curl", "-s", "http://"+addr+"/v1/sandboxes").Output()
	if err == nil && strings.Contains(string(resp), `"state":"running"`) {
		t.Fatalf("sandbox still running after the shell ended: %s", resp)
	}
}
