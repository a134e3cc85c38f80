package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// matrixHostDirOp is the matrix's host-directory row: the API has no host
// directories (an API client naming host paths would be a hole), so a
// writable host directory is what `airlock run --mount DIR:DST:rw` and
// `--workspace DIR` give a one-shot sandbox, run here with the server's
// own binary.
const matrixHostDirOp = "airlock run --mount DIR:/out:rw, DIR of another user"

// matrixHostDir runs the host-directory row for tier: a directory owned by
// another unprivileged host user (4321, 0755) is writable inside without a
// chown, the file is the directory owner's on the host, a set-uid mode is
// refused and never reaches the host. A tier that declares no volumes
// (the capability covers host directories too) has its refusal from the
// volume column, which the API checked.
func matrixHostDir(t *testing.T, tier string, caps client.RuntimeCaps, cells []matrixCell) string {
	t.Helper()
	if !caps.Volumes {
		for _, c := range cells {
			if c.tier == tier && c.root == "volume" && c.op == matrixOps[0] {
				if c.result != "refused (volumes)" {
					t.Errorf("%s / host dir: declares no volumes, but the volume column says %q", tier, c.result)
					return "FAILED"
				}
				return c.result
			}
		}
		t.Errorf("%s / host dir: no volume column to take the refusal from", tier)
		return "FAILED"
	}
	const owner = 4321
	dir := filepath.Join(t.TempDir(), "hostdir")
	if !caps.HostDirs {
		// Volumes but no host directories (microvm: virtio-fs volumes, no
		// binds of host paths): run refuses the mount, naming the capability.
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(airlockBin(t), "run", "--runtime", tier, "--mount", dir+":/out:rw", "--", "/bin/true").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "host_dirs") {
			t.Errorf("%s / host dir: declares no host_dirs, but run with --mount gave %v: %q", tier, err, out)
			return "FAILED"
		}
		return "refused (host_dirs)"
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, owner, owner); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(airlockBin(t), "run", "--runtime", tier, "--mount", dir+":/out:rw", "--", "/bin/sh", "-c",
		"echo "+tier+" > /out/f && stat -c %u:%g /out/f; chmod u+s /out/f 2>/dev/null; echo chmod=$?").Output()
	fail := func(format string, args ...any) string {
		t.Errorf("%s / host dir: "+format, append([]any{tier}, args...)...)
		return "FAILED"
	}
	if err != nil {
		return fail("%v: %q", err, out)
	}
	if string(out) != "1000:1000\nchmod=1\n" { // strict's user
		return fail("inside: %q, want the sandbox user's file and chmod u+s refused", out)
	}
	fi, err := os.Lstat(filepath.Join(dir, "f"))
	if err != nil {
		return fail("%v", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); st.Uid != owner || st.Gid != owner || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || strings.TrimSpace(string(b)) != tier {
		return fail("on the host: uid %d gid %d mode %v content %q, want %d:%d without set-id bits", st.Uid, st.Gid, fi.Mode(), b, owner, owner)
	}
	return "ok: files are the directory owner's, set-uid refused"
}
