package wasm

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// The guest module (testdata/guest) is built once per test binary run,
// and one engine with a disk cache serves every test.
var (
	guestOnce sync.Once
	guestMod  Module
	guestErr  error
	engOnce   sync.Once
	eng       *Engine
	engErr    error
	buildDir  string
)

func TestMain(m *testing.M) {
	if os.Getenv(kernelEnv) != "" {
		// This binary is the kernel process of a QuickJS test (quickjs_test.go).
		os.Exit(ServeKernel(context.Background(), os.Getenv(kernelEnv), 96<<20))
	}
	if os.Getenv(stuckEnv) != "" {
		// This binary runs a module that never returns on an engine without
		// context checks (nocheck_linux_test.go).
		os.Exit(runStuck(os.Getenv(stuckEnv)))
	}
	d, err := os.MkdirTemp("", "airlock-wasm-test-")
	if err != nil {
		panic(err)
	}
	buildDir = d
	code := m.Run()
	if eng != nil {
		eng.Close()
	}
	os.RemoveAll(d)
	os.Exit(code)
}

// buildGo builds the Go program in testdata/NAME for wasip1.
func buildGo(name string) (string, error) {
	out := filepath.Join(buildDir, name+".wasm")
	goTool := "go" // go test puts its own toolchain first on $PATH
	cmd := exec.Command(goTool, "build", "-o", out, "./testdata/"+name)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building testdata/%s for wasip1: %v\n%s", name, err, b)
	}
	return out, nil
}

func guest(t testing.TB) Module {
	t.Helper()
	guestOnce.Do(func() {
		var p string
		if p, guestErr = buildGo("guest"); guestErr == nil {
			guestMod, guestErr = ReadModule(p)
		}
	})
	if guestErr != nil {
		t.Fatal(guestErr)
	}
	return guestMod
}

func engine(t testing.TB) *Engine {
	t.Helper()
	engOnce.Do(func() { eng, engErr = NewEngine(context.Background(), filepath.Join(buildDir, "cache")) })
	if engErr != nil {
		t.Fatal(engErr)
	}
	return eng
}

func strict(t testing.TB) policy.Policy {
	t.Helper()
	p, err := policy.Preset(policy.Strict)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// run runs the guest with argv[1:] = args under a strict policy adjusted
// by mod, with stdin (if any), capturing its output.
func run(t testing.TB, mod func(*policy.Policy), stdin string, args ...string) *native.Result {
	t.Helper()
	p := strict(t)
	p.Filesystem.Workspace = t.TempDir()
	if mod != nil {
		mod(&p)
	}
	opts := native.RunOptions{Capture: true}
	if stdin != "" {
		opts.Stdin = strings.NewReader(stdin)
	}
	g := guest(t)
	res, err := engine(t).Run(context.Background(), g, native.Config{Policy: p, Args: append([]string{g.Name}, args...)}, opts)
	if err != nil {
		t.Fatalf("run %q: %v", args, err)
	}
	return res
}

func TestStdinToStdout(t *testing.T) {
	res := run(t, nil, "hello\nwasm\n", "cat")
	if res.Status != native.StatusOK || res.ExitCode != 0 || res.Stdout != "hello\nwasm\n" {
		t.Fatalf("got %+v", res)
	}
	res = run(t, nil, "", "exit", "3")
	if res.Status != native.StatusNonzeroExit || res.ExitCode != 3 || res.Stderr != "exiting 3\n" {
		t.Fatalf("exit 3: got %+v", res)
	}
}

func TestArgsAndEnvAreThePolicys(t *testing.T) {
	t.Setenv("AIRLOCK_HOST_SECRET", "leak")
	res := run(t, func(p *policy.Policy) { p.SetEnv("GREETING", "hi there") }, "", "env")
	want := append(strict(t).Env, "GREETING=hi there", "PWD=/workspace")
	if res.Stdout != strings.Join(want, "\n")+"\n" {
		t.Fatalf("env: got\n%s\nwant\n%s", res.Stdout, strings.Join(want, "\n"))
	}
	res = run(t, nil, "", "args", "a b", "c")
	if !strings.HasSuffix(strings.TrimSpace(res.Stdout), "|args|a b|c") {
		t.Fatalf("args: got %q", res.Stdout)
	}
}

func TestClockAndRandomAreTheHosts(t *testing.T) {
	res := run(t, nil, "", "clock")
	var sec int64
	if _, err := fmt.Sscan(res.Stdout, &sec); err != nil || sec < time.Now().Add(-time.Hour).Unix() || sec > time.Now().Add(time.Hour).Unix() {
		t.Fatalf("guest clock %q is not the host's (%d)", res.Stdout, time.Now().Unix())
	}
	a, b := run(t, nil, "", "random").Stdout, run(t, nil, "", "random").Stdout
	if len(a) != 33 || a == b {
		t.Fatalf("random_get is not random: %q then %q", a, b)
	}
}

func TestWorkspaceIsWritable(t *testing.T) {
	ws := t.TempDir()
	res := run(t, func(p *policy.Policy) { p.Filesystem.Workspace = ws }, "", "write", "out.txt", "from wasm")
	if b, err := os.ReadFile(filepath.Join(ws, "out.txt")); err != nil || string(b) != "from wasm" || res.Stdout != "ok\n" {
		t.Fatalf("write to the workspace: %+v; host file %q, %v", res, b, err)
	}
	res = run(t, func(p *policy.Policy) { p.Filesystem.Workspace = ws }, "", "read", "/workspace/out.txt")
	if res.Stdout != "ok\nfrom wasm" {
		t.Fatalf("read back: %q", res.Stdout)
	}
	res = run(t, func(p *policy.Policy) { p.Filesystem.Workspace = ws }, "", "seek", "/workspace/out.txt", "5")
	if res.Stdout != "ok\nwasm" {
		t.Fatalf("read from offset 5 (fd_seek): %q", res.Stdout)
	}
}

func TestReadOnlyMountCannotBeWritten(t *testing.T) {
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "in.txt"), []byte("input"), 0o644); err != nil {
		t.Fatal(err)
	}
	ro := func(p *policy.Policy) {
		p.Filesystem.Mounts = []policy.Mount{{Source: data, Target: "/data"}}
	}
	if res := run(t, ro, "", "read", "/data/in.txt"); res.Stdout != "ok\ninput" {
		t.Fatalf("read from a read-only mount: %+v", res)
	}
	for _, args := range [][]string{
		{"write", "/data/new.txt", "x"}, {"write", "/data/in.txt", "changed"}, {"mkdir", "/data/d"},
		{"remove", "/data/in.txt"}, {"symlink", "in.txt", "/data/l"},
	} {
		res := run(t, ro, "", args...)
		if !strings.HasPrefix(res.Stdout, "error:") {
			t.Errorf("%q on a read-only mount: %q", args, res.Stdout)
		}
	}
	// Checked from the host: nothing changed.
	ents, _ := os.ReadDir(data)
	b, _ := os.ReadFile(filepath.Join(data, "in.txt"))
	if len(ents) != 1 || string(b) != "input" {
		t.Fatalf("read-only mount changed: %d entries, in.txt %q", len(ents), b)
	}
	// The same directory mounted rw can be written.
	res := run(t, func(p *policy.Policy) {
		p.Filesystem.Mounts = []policy.Mount{{Source: data, Target: "/data", Writable: true}}
	}, "", "write", "/data/new.txt", "x")
	if _, err := os.Stat(filepath.Join(data, "new.txt")); err != nil || res.Stdout != "ok\n" {
		t.Fatalf("rw mount: %+v, %v", res, err)
	}
}

// escapeFixture is a workspace inside a directory that holds a secret,
// with symlinks planted by the host pointing out of the workspace.
func escapeFixture(t *testing.T) (ws string) {
	t.Helper()
	top := t.TempDir()
	ws = filepath.Join(top, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(top, "secret"), []byte("TOPSECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"up": "..", "abs": top, "file": filepath.Join(top, "secret")} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	return ws
}

func TestPreopenEscapesAreRefused(t *testing.T) {
	ws := escapeFixture(t)
	inWS := func(p *policy.Policy) { p.Filesystem.Workspace = ws }
	for _, args := range [][]string{
		{"read", "/workspace/../secret"}, {"openat", "3", "../secret"}, {"openat", "3", "/secret"},
		{"openat", "3", "up/secret"}, {"openat", "3", "abs/secret"}, {"openat", "3", "file"},
		{"read", "/workspace/up/secret"}, {"read", "/workspace/abs/secret"}, {"read", "/workspace/file"},
		{"read", "/etc/passwd"}, {"read", "/proc/self/environ"},
	} {
		res := run(t, inWS, "", args...)
		if strings.Contains(res.Stdout, "TOPSECRET") || strings.Contains(res.Stdout, "root:") || !strings.HasPrefix(res.Stdout, "error:") {
			t.Errorf("%q escaped the preopen: %q", args, res.Stdout)
		}
	}
	// A symlink the guest makes is refused, and nothing is left on the host.
	res := run(t, inWS, "", "symlink", "..", "/workspace/mine")
	if _, err := os.Lstat(filepath.Join(ws, "mine")); err == nil || !strings.HasPrefix(res.Stdout, "error:") {
		t.Fatalf("guest symlink: %q, left on host: %v", res.Stdout, err == nil)
	}
}

// TestRootFSRefusesEscapes checks the host side directly, below wazero's
// own path cleaning.
func TestRootFSRefusesEscapes(t *testing.T) {
	ws := escapeFixture(t)
	fs, err := newRootFS(ws, false)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.close()
	for _, p := range []string{"../secret", "up/secret", "abs/secret", "file", "/secret"} {
		if f, e := fs.OpenFile(p, 0, 0); e == 0 {
			f.Close()
			t.Errorf("OpenFile(%q) escaped the directory", p)
		}
		if _, e := fs.Stat(p); e == 0 {
			t.Errorf("Stat(%q) escaped the directory", p)
		}
	}
	if e := fs.Mkdir("up/newdir", 0o755); e == 0 {
		t.Errorf("Mkdir through a symlink escaped")
	}
	// A hard link to the planted symlink is another symlink: still refused.
	_ = fs.Link("file", "hard")
	if f, e := fs.OpenFile("hard", 0, 0); e == 0 {
		f.Close()
		t.Errorf("a hard link to an outside symlink escaped")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(ws), "newdir")); err == nil {
		t.Errorf("a directory was made outside the workspace")
	}
}

func TestInfiniteLoopEndsAtDeadline(t *testing.T) {
	for _, mode := range []string{"loop", "sleep"} {
		res := run(t, func(p *policy.Policy) { p.Limits.WallTime = 300 * time.Millisecond }, "", mode)
		if res.Status != native.StatusTimeout || res.ExitCode != exitKilled {
			t.Fatalf("%s: got %+v", mode, res)
		}
	}
	// A read of stdin that never ends is stopped too.
	pr, pw, _ := os.Pipe()
	defer pw.Close()
	defer pr.Close()
	p := strict(t)
	p.Limits.WallTime = 300 * time.Millisecond
	g := guest(t)
	res, err := engine(t).Run(context.Background(), g, native.Config{Policy: p, Args: []string{g.Name, "cat"}}, native.RunOptions{Stdin: pr})
	if err != nil || res.Status != native.StatusTimeout {
		t.Fatalf("blocked stdin: %+v, %v", res, err)
	}
}

func TestMemoryGrowthStopsAtLimit(t *testing.T) {
	const limit = 64 << 20
	res := run(t, func(p *policy.Policy) { p.Limits.MemoryBytes = limit }, "", "grow")
	if res.Status != native.StatusOOM {
		t.Fatalf("got %+v", res)
	}
	if res.PeakMemoryBytes > limit || res.PeakMemoryBytes < limit/2 {
		t.Fatalf("peak linear memory %d, limit %d", res.PeakMemoryBytes, limit)
	}
	if !strings.Contains(res.Stdout, "\n32\n") {
		t.Fatalf("the module did not get to allocate: %q", res.Stdout)
	}
}

func TestHundredMegabytePrintIsCapped(t *testing.T) {
	const limit = 1 << 20
	res := run(t, func(p *policy.Policy) { p.Limits.OutputBytes = limit }, "", "print", "100")
	if res.Status != native.StatusOutputLimit || !res.Truncated || len(res.Stdout) != limit {
		t.Fatalf("status %s truncated %v stdout %d bytes", res.Status, res.Truncated, len(res.Stdout))
	}
}

func TestNoNetwork(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	res := run(t, nil, "", "dial", ln.Addr().String())
	if !strings.HasPrefix(res.Stdout, "error:") {
		t.Fatalf("dial: %q", res.Stdout)
	}
	// Checked from the host: no connection reached the listener.
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(50 * time.Millisecond))
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Fatal("the module connected to the host")
	}
	for _, l := range run(t, nil, "", "exit", "0").Enforced {
		if l.Name == "network" && !strings.HasPrefix(l.Detail, "none") {
			t.Fatalf("network layer: %+v", l)
		}
	}
}

func TestDiskCacheIsUsedByASecondEngine(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	g := guest(t)
	for i := range 2 {
		e, err := NewEngine(context.Background(), dir)
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.Run(context.Background(), g, native.Config{Policy: strict(t), Args: []string{g.Name}}, native.RunOptions{Capture: true})
		e.Close()
		if err != nil || res.Stdout != "hello from wasm\n" {
			t.Fatalf("run %d: %+v, %v", i, res, err)
		}
		var n int
		_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, _ error) error {
			if d != nil && !d.IsDir() {
				n++
			}
			return nil
		})
		if n == 0 {
			t.Fatalf("run %d: nothing in the disk cache %s", i, dir)
		}
	}
}

func TestCacheDirOthersCanWriteIsRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := NewEngine(context.Background(), dir); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Fatalf("got %v", err)
	}
}

func TestNotAModule(t *testing.T) {
	res, err := engine(t).Run(context.Background(), Module{Name: "x", Bytes: []byte("#!/bin/sh\n")}, native.Config{Policy: strict(t), Args: []string{"x"}}, native.RunOptions{})
	if err == nil || res.Status != native.StatusSetupError || !strings.Contains(res.Error, "wasm module") {
		t.Fatalf("got %+v, %v", res, err)
	}
}

func TestHelloModule(t *testing.T) {
	res, err := engine(t).Run(context.Background(), Module{Name: "hello.wasm", Bytes: HelloModule()}, native.Config{Policy: strict(t)}, native.RunOptions{Capture: true})
	if err != nil || res.Status != native.StatusOK || res.Stdout != HelloOutput {
		t.Fatalf("got %+v, %v", res, err)
	}
}

// TestDiskLimits: a module cannot fill the host's disk through a writable
// directory: bytes, files and file size are capped per directory, checked
// from the host.
func TestDiskLimits(t *testing.T) {
	ws := t.TempDir()
	lim := func(p *policy.Policy) {
		p.Filesystem.Workspace = ws
		p.Limits.DiskBytes, p.Limits.Inodes, p.Limits.FileSizeBytes = 8<<20, 100, 4<<20
	}
	res := run(t, lim, "", "fill", "/workspace/big")
	fi, err := os.Stat(filepath.Join(ws, "big"))
	if err != nil || fi.Size() > 4<<20 || !strings.Contains(res.Stdout, "error:") {
		t.Fatalf("file size: %q, host file %v", res.Stdout, fi.Size())
	}
	res = run(t, func(p *policy.Policy) { lim(p); p.Limits.FileSizeBytes = 64 << 20 }, "", "fill", "/tmp/big")
	if !strings.Contains(res.Stdout, "wrote 8 MiB") || !strings.Contains(res.Stdout, "error:") {
		t.Fatalf("disk: %q", res.Stdout)
	}
	if err := os.Mkdir(filepath.Join(ws, "many"), 0o755); err != nil {
		t.Fatal(err)
	}
	res = run(t, lim, "", "files", "/workspace/many")
	ents, _ := os.ReadDir(filepath.Join(ws, "many"))
	if len(ents) > 100 || !strings.Contains(res.Stdout, "error:") {
		t.Fatalf("inodes: %q, %d files on the host", res.Stdout, len(ents))
	}
}

func TestDefaultCacheDir(t *testing.T) {
	t.Setenv("AIRLOCK_WASM_CACHE", "/srv/wasm-cache")
	if d, err := DefaultCacheDir(); err != nil || d != "/srv/wasm-cache" {
		t.Fatalf("with AIRLOCK_WASM_CACHE: %q %v", d, err)
	}
	t.Setenv("AIRLOCK_WASM_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "/home/u/.cache")
	if d, err := DefaultCacheDir(); err != nil || d != "/home/u/.cache/airlock/wasm" {
		t.Fatalf("default: %q %v", d, err)
	}
}
