package wasm

import (
	"context"
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

var (
	cOnce sync.Once
	cMod  Module
	cErr  error
)

// cGuest builds testdata/cguest with Debian's clang and wasi-libc
// (scripts/setup.sh --tests installs clang, lld, wasi-libc and
// libclang-rt-14-dev-wasm32), once per test binary run.
func cGuest(t *testing.T) Module {
	t.Helper()
	cOnce.Do(func() {
		if _, err := os.Stat("/usr/lib/wasm32-wasi/libc.a"); err != nil {
			cErr = err
			return
		}
		out := filepath.Join(buildDir, "cguest.wasm")
		cmd := exec.Command("clang", "--target=wasm32-wasi", "--sysroot=/usr", "-O2", "-o", out, "testdata/cguest/main.c")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building testdata/cguest: %v\n%s", err, b)
		}
		cMod, cErr = ReadModule(out)
	})
	if cErr != nil {
		t.Skipf("no C toolchain for wasm32-wasi (scripts/setup.sh --tests installs clang, lld, wasi-libc, libclang-rt-14-dev-wasm32): %v", cErr)
	}
	return cMod
}

// TestCModule runs the properties of the Go tests against a C program
// built with wasi-libc: stdin to stdout, a read-only mount, escapes, the
// deadline, the memory limit and the output cap.
func TestCModule(t *testing.T) {
	m := cGuest(t)
	ws := escapeFixture(t)
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "in.txt"), []byte("input"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(mod func(*policy.Policy), stdin string, args ...string) *native.Result {
		t.Helper()
		p := strict(t)
		p.Filesystem.Workspace = ws
		p.Filesystem.Mounts = []policy.Mount{{Source: data, Target: "/data"}}
		if mod != nil {
			mod(&p)
		}
		opts := native.RunOptions{Capture: true}
		if stdin != "" {
			opts.Stdin = strings.NewReader(stdin)
		}
		res, err := engine(t).Run(context.Background(), m, native.Config{Policy: p, Args: append([]string{"cguest.wasm"}, args...)}, opts)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		return res
	}
	if res := run(nil, "from stdin\n", "cat"); res.Status != native.StatusOK || res.Stdout != "from stdin\n" {
		t.Fatalf("cat: %+v", res)
	}
	if res := run(nil, "", "read", "/data/in.txt"); res.Stdout != "ok\ninput" {
		t.Fatalf("read: %+v", res)
	}
	if res := run(nil, "", "write", "/data/in.txt"); !strings.HasPrefix(res.Stdout, "error:") {
		t.Errorf("write to a read-only mount: %q", res.Stdout)
	}
	if b, _ := os.ReadFile(filepath.Join(data, "in.txt")); string(b) != "input" {
		t.Errorf("read-only mount changed: %q", b)
	}
	for _, path := range []string{"/workspace/../secret", "/workspace/up/secret", "/workspace/abs/secret", "/workspace/file", "/etc/passwd"} {
		if res := run(nil, "", "read", path); !strings.HasPrefix(res.Stdout, "error:") || strings.Contains(res.Stdout, "TOPSECRET") {
			t.Errorf("read %s escaped: %q", path, res.Stdout)
		}
	}
	if res := run(func(p *policy.Policy) { p.Limits.WallTime = 300 * time.Millisecond }, "", "loop"); res.Status != native.StatusTimeout {
		t.Errorf("loop: %+v", res)
	}
	if res := run(func(p *policy.Policy) { p.Limits.MemoryBytes = 64 << 20 }, "", "grow"); res.Status != native.StatusOOM || res.PeakMemoryBytes > 64<<20 {
		t.Errorf("grow: %+v", res)
	}
	if res := run(func(p *policy.Policy) { p.Limits.OutputBytes = 1 << 20 }, "", "print", "100"); res.Status != native.StatusOutputLimit || len(res.Stdout) != 1<<20 {
		t.Errorf("print 100 MB: status %s, %d bytes", res.Status, len(res.Stdout))
	}
}
