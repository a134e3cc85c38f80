package native_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// hostOwner owns the host directories of these tests: an unprivileged uid
// outside airlock's ranges, as a developer's home directory would be.
const hostOwner = 4321

// hostileHostDirScript runs inside the sandbox against DIR (its view of the
// host directory) and prints one line per attempt: what it tried and the
// outcome as seen inside. The host side checks the outcomes itself.
const hostileHostDirScript = `
import os, stat, subprocess, tarfile, io, errno
D = os.environ["D"]
def try_(name, f):
    try:
        f(); print(name, "ok")
    except OSError as e:
        print(name, "denied", errno.errorcode.get(e.errno, e.errno))
def write(p, data="x\n"):
    with open(p, "w") as fh: fh.write(data)
try_("write", lambda: write(D + "/new.txt", "from the sandbox\n"))
try_("mkdir", lambda: os.mkdir(D + "/sub"))
try_("write-sub", lambda: write(D + "/sub/deep.txt"))
print("owner-inside", os.stat(D + "/new.txt").st_uid, os.getuid())
try_("chmod-suid", lambda: os.chmod(D + "/new.txt", 0o4755))
try_("chmod-sgid", lambda: os.chmod(D + "/new.txt", 0o2755))
try_("chmod-sgid-dir", lambda: os.chmod(D + "/sub", 0o2775))
try_("chmod-plain", lambda: os.chmod(D + "/new.txt", 0o755))
fd = os.open(D + "/new.txt", os.O_RDONLY)
try_("fchmod-suid", lambda: os.fchmod(fd, 0o4755))
os.close(fd)
try_("open-creat-suid", lambda: os.close(os.open(D + "/o.suid", os.O_CREAT | os.O_WRONLY, 0o4755)))
try_("mknod-suid", lambda: os.mknod(D + "/m.suid", stat.S_IFREG | 0o4755))
try_("chown-root", lambda: os.chown(D + "/new.txt", 0, 0))
try_("write-root-file", lambda: write(D + "/root.txt"))
try_("chmod-root-file", lambda: os.chmod(D + "/root.txt", 0o4777))
try_("hardlink-out", lambda: os.link("/etc/hostname", D + "/hard"))
try_("symlink-etc", lambda: os.symlink("/etc/passwd", D + "/link"))
try_("symlink-up", lambda: os.symlink("../../../../../../..", D + "/up"))
try_("write-through-up", lambda: write(D + "/up/tmp/escaped.txt"))
try_("dotdot", lambda: write(D + "/../escaped2.txt"))
r = subprocess.run(["install", "-m", "4755", "/bin/true", D + "/installed"], capture_output=True)
print("install-4755", r.returncode)
r = subprocess.run(["cp", "-p", "/bin/true", D + "/copied"], capture_output=True)
print("cp-p", r.returncode)
b = io.BytesIO()
with tarfile.open(fileobj=b, mode="w") as t:
    ti = tarfile.TarInfo("tarred"); ti.mode = 0o6755; data = b"#!/bin/sh\nid\n"; ti.size = len(data)
    t.addfile(ti, io.BytesIO(data))
open("/tmp/x.tar", "wb").write(b.getvalue())
r = subprocess.run(["tar", "-C", D, "-xpf", "/tmp/x.tar"], capture_output=True)
print("tar-xp", r.returncode)
`

// TestHostDirIDMapped: a host directory owned by an unprivileged host user
// (0755, not writable by the sandbox's host uid) is writable inside as
// --mount DIR:/out:rw and as --workspace, through an ID-mapped mount, and
// the host side holds the promises: every file the sandbox made belongs
// to the directory's owner (never root, never the sandbox's range), no
// file in the directory has a set-uid or set-gid bit whatever the sandbox
// tried (chmod, fchmod, open/mknod modes, install, cp -p, tar -xp), the
// root-owned file in it is untouched, nothing was written outside it, and
// the sandbox's symlinks stay symlinks on the host.
func TestHostDirIDMapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("ID-mapped mounts need root")
	}
	for _, tc := range []struct {
		name   string
		target string
		set    func(p *policy.Policy, dir string)
	}{
		{"mount", "/out", func(p *policy.Policy, dir string) {
			p.Filesystem.Mounts = []policy.Mount{{Source: dir, Target: "/out", Writable: true}}
		}},
		{"workspace", "/workspace", func(p *policy.Policy, dir string) { p.Filesystem.Workspace = dir }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			os.Chmod(parent, 0o755)
			dir := filepath.Join(parent, "proj")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "root.txt"), []byte("root's\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, hostOwner, hostOwner); err != nil {
				t.Fatal(err)
			}
			p := strict(t)
			tc.set(&p, dir)
			p.Env = append(p.Env, "D="+tc.target)
			res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/usr/bin/python3", "-c", hostileHostDirScript}},
				native.RunOptions{Capture: true})
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if res.Status != native.StatusOK {
				t.Fatalf("script failed: %+v", res)
			}
			out := map[string]string{}
			for _, l := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
				k, v, _ := strings.Cut(l, " ")
				out[k] = v
			}
			t.Logf("inside: %v", out)
			for _, k := range []string{"write", "mkdir", "write-sub", "chmod-plain"} {
				if out[k] != "ok" {
					t.Errorf("%s: %q, want ok (the directory must be writable through the mapping)", k, out[k])
				}
			}
			if f := strings.Fields(out["owner-inside"]); len(f) != 2 || f[0] != f[1] {
				t.Errorf("inside, the sandbox's file is not its user's: %q", out["owner-inside"])
			}
			for _, k := range []string{"chmod-suid", "chmod-sgid", "chmod-sgid-dir", "fchmod-suid", "open-creat-suid", "mknod-suid"} {
				if out[k] != "denied EPERM" {
					t.Errorf("%s: %q, want denied EPERM (seccomp)", k, out[k])
				}
			}
			for _, k := range []string{"chown-root", "write-root-file", "chmod-root-file", "hardlink-out"} {
				if !strings.HasPrefix(out[k], "denied") {
					t.Errorf("%s: %q, want denied", k, out[k])
				}
			}
			if !strings.Contains(res.Stdout, "install-4755 ") || !strings.Contains(res.Stdout, "tar-xp ") {
				t.Errorf("script did not get to install and tar: %q", res.Stdout)
			}

			// The host side: walk the directory without following links.
			var seen []string
			err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				fi, err := os.Lstat(path)
				if err != nil {
					return err
				}
				st := fi.Sys().(*syscall.Stat_t)
				rel, _ := filepath.Rel(dir, path)
				seen = append(seen, rel)
				if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
					t.Errorf("host: %s has mode %v: a set-uid/set-gid file left by the sandbox", rel, fi.Mode())
				}
				if rel == "root.txt" {
					if st.Uid != 0 || fi.Mode().Perm() != 0o644 {
						t.Errorf("host: root.txt changed: uid %d mode %v", st.Uid, fi.Mode())
					}
					if b, _ := os.ReadFile(path); string(b) != "root's\n" {
						t.Errorf("host: root.txt written: %q", b)
					}
					return nil
				}
				if st.Uid != hostOwner || st.Gid != hostOwner {
					t.Errorf("host: %s is owned by %d:%d, want the directory's owner %d:%d", rel, st.Uid, st.Gid, hostOwner, hostOwner)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"new.txt", "sub/deep.txt", "link", "up"} {
				if !contains(seen, want) {
					t.Errorf("host: %s missing (saw %v)", want, seen)
				}
			}
			for _, l := range []string{"link", "up"} {
				if fi, err := os.Lstat(filepath.Join(dir, l)); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
					t.Errorf("host: %s is no longer the sandbox's symlink: %v %v", l, fi, err)
				}
			}
			if b, err := os.ReadFile(filepath.Join(dir, "new.txt")); err != nil || string(b) != "from the sandbox\n" {
				t.Errorf("host: new.txt: %q %v", b, err)
			}
			for _, p := range []string{filepath.Join(parent, "escaped2.txt"), "/tmp/escaped.txt"} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("host: %s was written outside the directory", p)
				}
			}
			if ents, _ := os.ReadDir(parent); len(ents) != 1 {
				t.Errorf("host: the directory's parent holds %d entries, want only the directory", len(ents))
			}
			found := false
			for _, l := range res.Enforced {
				if l.Name == "hostdirs" && strings.Contains(l.Detail, dir) {
					found = true
				}
			}
			if !found {
				t.Errorf("no hostdirs layer naming %s in %+v", dir, res.Enforced)
			}
		})
	}
}

// TestHostDirRootOwnedRefused: a root-owned directory the sandbox cannot
// write is not ID-mapped (its files would be host root's), with an error
// naming the cause and the ways out.
func TestHostDirRootOwnedRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if err := os.Chown(dir, hostOwner, 0); err != nil {
		t.Fatal(err)
	}
	p := strict(t)
	p.Filesystem.Mounts = []policy.Mount{{Source: dir, Target: "/out", Writable: true}}
	_, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"true"}}, native.RunOptions{})
	if err == nil || !strings.Contains(err.Error(), "gid 0 (root)") || !strings.Contains(err.Error(), "chown") {
		t.Fatalf("a directory of group root was ID-mapped, or the error does not say why: %v", err)
	}
}

func contains(ss []string, s string) bool {
	for _, v := range ss {
		if v == s {
			return true
		}
	}
	return false
}
