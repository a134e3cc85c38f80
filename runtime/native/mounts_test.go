package native_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// TestMounts: a read-only mount cannot be written, a read-write one can, and
// the host sees exactly the writes to the read-write one.
func TestMounts(t *testing.T) {
	ro, rw := t.TempDir(), filepath.Join(t.TempDir(), "rw")
	if err := os.WriteFile(filepath.Join(ro, "data.txt"), []byte("read me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(rw, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(rw, 0o777) // the sandbox user is not the host's owner of this directory
	res := sh(t, func(p *policy.Policy) {
		p.Filesystem.Mounts = []policy.Mount{{Source: ro, Target: "/data"}, {Source: rw, Target: "/out", Writable: true}}
	}, "cat /data/data.txt; echo; echo x > /data/new 2>/dev/null && echo WROTE-RO; echo result > /out/r.txt && echo wrote-rw")
	if !strings.Contains(res.Stdout, "read me") || strings.Contains(res.Stdout, "WROTE-RO") || !strings.Contains(res.Stdout, "wrote-rw") {
		t.Fatalf("got %q %q", res.Stdout, res.Stderr)
	}
	if _, err := os.Stat(filepath.Join(ro, "new")); err == nil {
		t.Fatal("read-only mount was written on the host")
	}
	if b, err := os.ReadFile(filepath.Join(rw, "r.txt")); err != nil || string(b) != "result\n" {
		t.Fatalf("read-write mount: %q %v", b, err)
	}
}

// TestHiddenPaths: hidden directories look empty, hidden files read empty.
func TestHiddenPaths(t *testing.T) {
	res := sh(t, func(p *policy.Policy) {
		p.Filesystem.Hidden = []string{"/usr/share/doc", "/usr/bin/perl"}
	}, "ls /usr/share/doc | wc -l; wc -c < /usr/bin/perl; ls /usr/share | head -1 >/dev/null && echo share-visible")
	if got := strings.Fields(res.Stdout); len(got) < 3 || got[0] != "0" || got[1] != "0" || got[2] != "share-visible" {
		t.Fatalf("got %q %q", res.Stdout, res.Stderr)
	}
}

// TestRlimits: the third layer is in place and enforced.
func TestRlimits(t *testing.T) {
	res := sh(t, func(p *policy.Policy) {
		p.Limits.OpenFiles = 64
		p.Limits.FileSizeBytes = 1 << 20
	}, `grep -E "Max (open files|file size|core file size)" /proc/self/limits
python3 -c "
fs = []
try:
    while True: fs.append(open('/dev/null'))
except OSError as e: print('nofile stop', len(fs) + 3)
"
dd if=/dev/zero of=/tmp/f bs=1M count=4 2>&1 | grep -o "File too large"`)
	if !strings.Contains(res.Stdout+res.Stderr, "File too large") && !strings.Contains(res.Stderr, "File size limit exceeded") {
		t.Errorf("a 4 MiB write passed the 1 MiB file size limit: %q %q", res.Stdout, res.Stderr)
	}
	for _, want := range []string{"Max open files            64", "Max file size             1048576", "Max core file size        0", "nofile stop 64"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("missing %q in %q (stderr %q)", want, res.Stdout, res.Stderr)
		}
	}
}

// TestInt80 : a 32-bit system call never succeeds (SIGSYS where the kernel
// has the 32-bit entry; a fault where it has none).
func TestInt80(t *testing.T) {
	_, res := probeIn(t, policy.Strict, "int80")
	if strings.Contains(res.Stdout, "alive") || res.Status == native.StatusOK {
		t.Fatalf("int 0x80 getpid survived: %+v", res)
	}
}

// TestWorkdirAndEnv: the program starts in the policy's workdir with exactly its env.
func TestWorkdirAndEnv(t *testing.T) {
	var want []string
	res := sh(t, func(p *policy.Policy) {
		p.Filesystem.Workdir = "/tmp"
		p.SetEnv("GREETING", "hi")
		want = append(want, p.Env...)
	}, "pwd; echo $GREETING; env -0 | tr '\\0' '\\n' | grep -v -e '^PWD=' -e '^SHLVL=' -e '^_=' | sort")
	lines := strings.Split(strings.TrimSuffix(res.Stdout, "\n"), "\n")
	if len(lines) < 2 || lines[0] != "/tmp" || lines[1] != "hi" {
		t.Fatalf("got %q", res.Stdout)
	}
	// The environment is exactly the policy's (plus what sh itself sets).
	sort.Strings(want)
	if got := lines[2:]; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("environment:\n%s\nwant exactly the policy's:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestBusyLauncher: a launcher holding more descriptors than the sandbox's
// open-files limit (a server with many sandboxes) still starts sandboxes.
func TestBusyLauncher(t *testing.T) {
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for i := 0; i < 300; i++ {
		f, err := os.Open("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	res := run(t, func(p *policy.Policy) { p.Limits.OpenFiles = 64 }, "true")
	if res.Status != native.StatusOK {
		t.Fatalf("got %+v", res)
	}
}

// TestTemplateFollowsHost: a host file copied into the root template is
// seen anew after the host replaces it (as package managers do, by rename).
func TestTemplateFollowsHost(t *testing.T) {
	// Not under /tmp, which is a fresh tmpfs inside the sandbox.
	base, err := os.MkdirTemp("/var/tmp", "airlock-etc-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	dir := filepath.Join(base, "etc")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(v string) {
		tmp := filepath.Join(dir, ".new")
		if err := os.WriteFile(tmp, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "conf")); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []string{"one", "two"} {
		write(v)
		res := run(t, func(p *policy.Policy) { p.Filesystem.EtcFiles = append(p.Filesystem.EtcFiles, dir) }, "cat", dir+"/conf")
		if res.Stdout != v {
			t.Fatalf("sandbox sees %q, host has %q", res.Stdout, v)
		}
	}
}

// TestHomeUser: /home/user is the workspace (E2B's home directory): the
// same files, and a process working there is in /home/user by getcwd(2)
// (E2B's code-interpreter tests print Python's and node's cwd), not in
// /workspace through a link; the second mount keeps the workspace's
// nosuid and nodev and its disk cap. The same with a host directory as the
// workspace.
func TestHomeUser(t *testing.T) {
	const script = `cd /home/user && echo hi > f && cat /workspace/f && pwd -P && python3 -c 'import os; print(os.getcwd())'
grep ' /home/user ' /proc/self/mountinfo | grep -q 'nosuid,nodev' && echo flags-kept
if head -c 3000000 /dev/zero > /home/user/big 2>/dev/null; then echo over-the-cap; fi; rm -f /home/user/big`
	want := "hi\n/home/user\n/home/user\nflags-kept\n"
	if underTest == policy.RuntimeGVisor {
		// A one-shot gVisor run has no privileged agent to make the second
		// mount: /home/user is a link to the workspace there (sandboxes the
		// server starts bind it: e2b TestCommandsStartInHome).
		want = "hi\n/workspace\n/workspace\n"
	}
	res := sh(t, func(p *policy.Policy) { p.Limits.DiskBytes = 1 << 20 }, script)
	if res.Stdout != want {
		t.Fatalf("tmpfs workspace: got %q, want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	res = sh(t, func(p *policy.Policy) { p.Filesystem.Workspace = dir }, strings.Split(script, "\nif")[0])
	if res.Stdout != want {
		t.Fatalf("host workspace: got %q, want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "hi\n" {
		t.Fatalf("host workspace: the file written through /home/user: %q %v", b, err)
	}
}

// TestMountsUnderTmpfs: mount targets inside the tmpfs /workspace and /tmp
// (directories, nested ones, and a single file) work, and the tmpfs around
// them stays writable.
func TestMountsUnderTmpfs(t *testing.T) {
	src, rw := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "data.txt"), []byte("read me"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(rw, 0o777)
	cfg := filepath.Join(t.TempDir(), "cfg.txt")
	if err := os.WriteFile(cfg, []byte("config"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := sh(t, func(p *policy.Policy) {
		p.Filesystem.Mounts = []policy.Mount{{Source: src, Target: "/workspace/sub"},
			{Source: rw, Target: "/tmp/a/b/out", Writable: true}, {Source: cfg, Target: "/workspace/etc/cfg.txt"}}
	}, "cat /workspace/sub/data.txt; echo; cat /workspace/etc/cfg.txt; echo; echo r > /tmp/a/b/out/r.txt && echo wrote-rw; echo w > /workspace/w && echo workspace-writable; echo x > /workspace/sub/x 2>/dev/null && echo WROTE-RO")
	for _, w := range []string{"read me", "config", "wrote-rw", "workspace-writable"} {
		if !strings.Contains(res.Stdout, w) {
			t.Errorf("stdout lacks %q: %q (stderr %q, status %s)", w, res.Stdout, res.Stderr, res.Status)
		}
	}
	if strings.Contains(res.Stdout, "WROTE-RO") {
		t.Error("a read-only mount under /workspace was written")
	}
	if b, err := os.ReadFile(filepath.Join(rw, "r.txt")); err != nil || string(b) != "r\n" {
		t.Errorf("read-write mount under /tmp: %q %v", b, err)
	}
}

// TestWritableMountNotWritable: a read-write mount of a directory the
// sandbox user cannot write (root-owned, 0755) is refused at setup with an
// error that says what to do, instead of a sandbox whose writes fail.
func TestWritableMountNotWritable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to own the directory")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	p := strict(t)
	p.Filesystem.Mounts = []policy.Mount{{Source: dir, Target: "/out", Writable: true}}
	_, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"true"}}, native.RunOptions{})
	if err == nil {
		t.Fatal("a read-write mount the sandbox cannot write was accepted")
	}
	for _, w := range []string{dir, "cannot write", "chmod", "read-only"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
	// Read-only, the same directory is fine.
	p.Filesystem.Mounts[0].Writable = false
	if res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"true"}}, native.RunOptions{}); err != nil || res.Status != native.StatusOK {
		t.Fatalf("read-only mount: %v %+v", err, res)
	}
}
