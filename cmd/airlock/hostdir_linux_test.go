package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	it "github.com/airlock-dev/airlock/imagestore/imagetest"
)

// TestRunHostDirIDMapped: through the CLI, `--mount DIR:/out:rw` and
// `--workspace DIR` of a directory owned by another unprivileged host user
// (0755) are writable inside without chown; on the host the files belong
// to the directory's owner and `chmod u+s` inside failed (no set-uid file).
func TestRunHostDirIDMapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("ID-mapped mounts need root")
	}
	const owner = 4321
	dir := filepath.Join(t.TempDir(), "proj")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, owner, owner); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, nil, "run", "--mount", dir+":/out:rw", "--", "sh", "-c",
		"echo mounted > /out/a.txt && chmod u+s /out/a.txt; echo chmod=$?")
	if code != 0 || !strings.Contains(out, "chmod=1") {
		t.Fatalf("--mount: code %d out %q err %q (want the write to work and chmod u+s to fail)", code, out, errOut)
	}
	out, errOut, code = runCLI(t, nil, "run", "--workspace", dir, "--", "sh", "-c", "echo ws > /workspace/b.txt && pwd")
	if code != 0 || out != "/workspace\n" {
		t.Fatalf("--workspace: code %d out %q err %q", code, out, errOut)
	}
	for name, want := range map[string]string{"a.txt": "mounted\n", "b.txt": "ws\n"} {
		p := filepath.Join(dir, name)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != owner || st.Gid != owner || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s on the host: uid %d gid %d mode %v, want %d:%d without set-id bits", name, st.Uid, st.Gid, fi.Mode(), owner, owner)
		}
		if b, _ := os.ReadFile(p); string(b) != want {
			t.Errorf("%s on the host: %q", name, b)
		}
	}
}

// TestRunImageUserRoot: `airlock run --image REF --user root` runs as the
// image's root with the root capabilities of its namespace (chown works;
// without --user it fails); --user without --image, or another user, is
// refused with the cause.
func TestRunImageUserRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("image roots need root")
	}
	ref := it.Push(t, it.Registry(t), "cli/busybox:root", it.Busybox(t))
	state := t.TempDir()
	script := "echo x > /usr/local/f && chown 1234:1234 /usr/local/f && stat -c %u:%g /usr/local/f; grep CapEff /proc/self/status"
	out, errOut, code := runCLI(t, nil, "run", "--state-dir", state, "--image", ref, "--user", "root", "--", "/bin/sh", "-c", script)
	if code != 0 || out != "1234:1234\nCapEff:\t00000000000004cf\n" {
		t.Fatalf("--user root: %d %q %q", code, out, errOut)
	}
	if out, _, _ := runCLI(t, nil, "run", "--state-dir", state, "--image", ref, "--", "/bin/sh", "-c", script); strings.Contains(out, "1234:1234") || !strings.Contains(out, "CapEff:\t0000000000000000") {
		t.Fatalf("without --user root: %q, want a failed chown and no capabilities", out)
	}
	for _, args := range [][]string{{"--user", "root"}, {"--image", ref, "--user", "admin"}} {
		_, errOut, code := runCLI(t, nil, append(append([]string{"run", "--state-dir", state}, args...), "--", "true")...)
		if code == 0 || !strings.Contains(errOut, "--user") {
			t.Errorf("run %v: %d %q, want a refusal naming --user", args, code, errOut)
		}
	}
}
