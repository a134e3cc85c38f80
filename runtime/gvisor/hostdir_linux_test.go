package gvisor_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/runtime/native"
)

// TestHostDirIDMapped: a writable host directory (`--mount DIR:/out:rw`)
// and a host workspace owned by another unprivileged host user (4321,
// 0755) are writable by the gvisor sandbox's user without a chown, as
// native's are: on the host, the files it creates belong to the
// directory's owner, not to the sandbox's uid 1000. It cannot reach
// further: a file of a third host user there shows as nobody and cannot
// be written, a chown to that user fails, a set-uid bit never reaches the
// host, and nothing is left attached once the run ends.
func TestHostDirIDMapped(t *testing.T) {
	needRunsc(t)
	const owner, third = 4321, 4322
	mk := func(name string) string {
		d := filepath.Join(t.TempDir(), name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, owner, owner); err != nil {
			t.Fatal(err)
		}
		return d
	}
	out, ws := mk("out"), mk("ws")
	other := filepath.Join(out, "other.txt")
	if err := os.WriteFile(other, []byte("third\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(other, third, third); err != nil {
		t.Fatal(err)
	}
	res := gvRun(t, func(p *policy.Policy) {
		p.Filesystem.Workspace = ws
		p.Filesystem.Mounts = append(p.Filesystem.Mounts, policy.Mount{Source: out, Target: "/out", Writable: true})
	}, "/bin/sh", "-c", `echo mounted > /out/a.txt && echo ws > /workspace/b.txt && stat -c '%u:%g' /out/a.txt /out/other.txt
echo x >> /out/other.txt 2>/dev/null; echo append=$?
chown 4322:4322 /out/a.txt 2>/dev/null; echo chown=$?
chmod u+s /out/a.txt 2>/dev/null; echo chmod=$?
/usr/bin/python3 -c 'import os; os.close(os.open("/out/s", os.O_CREAT|os.O_WRONLY, 0o4755))' 2>/dev/null; echo create-suid=$?`)
	if res.Status != native.StatusOK {
		t.Fatalf("run: %+v (stderr %q)", res, res.Stderr)
	}
	got := string(res.Stdout)
	if !strings.HasPrefix(got, "1000:1000\n65534:65534\n") || strings.Contains(got, "append=0\n") || !strings.Contains(got, "chown=1\n") ||
		!strings.Contains(got, "chmod=1\n") || strings.Contains(got, "create-suid=0\n") {
		t.Fatalf("inside: %q (stderr %q), want a.txt the sandbox user's, other.txt nobody's, neither writable nor chown-able, no set-uid mode given", got, res.Stderr)
	}
	for p, want := range map[string]string{filepath.Join(out, "a.txt"): "mounted\n", filepath.Join(ws, "b.txt"): "ws\n"} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != owner || st.Gid != owner || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s on the host: uid %d gid %d mode %v, want %d:%d without set-id bits", p, st.Uid, st.Gid, fi.Mode(), owner, owner)
		}
		if b, _ := os.ReadFile(p); string(b) != want {
			t.Errorf("%s on the host: %q", p, b)
		}
	}
	if b, _ := os.ReadFile(other); string(b) != "third\n" {
		t.Errorf("the third user's file changed: %q", b)
	}
	if fi, err := os.Stat(other); err != nil || fi.Sys().(*syscall.Stat_t).Uid != third {
		t.Errorf("the third user's file: %v %+v", err, fi)
	}
	if _, err := os.Lstat(filepath.Join(out, "s")); err == nil {
		t.Errorf("a file created with a set-uid mode is on the host")
	}
	if m, _ := filepath.Glob(filepath.Join(gvisor.StateBase, "hostdirs", "*")); len(m) > 0 {
		t.Errorf("staging mounts left: %v", m)
	}
}
