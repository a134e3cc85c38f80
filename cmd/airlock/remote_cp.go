package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/airlock-dev/airlock/client"
)

const cpUsage = `usage: airlock cp [flags] SANDBOX:PATH LOCAL    copy out of a sandbox
       airlock cp [flags] LOCAL SANDBOX:PATH    copy into a sandbox

LOCAL is a file, a directory (copied whole) or - (stdin or stdout, one
file's bytes). As with docker cp, a destination that is an existing
directory receives the source under its own name. A relative sandbox PATH
is under /workspace.

Copying out treats the sandbox's files as hostile: nothing is written
outside the destination (an os.Root confines every step); a symlink is
recreated only when it points inside the tree copied (one that is
absolute or climbs out with .. is skipped with a warning, so that no later
command on the host is led through it); set-id and sticky bits are
dropped; and a file or tree appears only once wholly copied (a failed copy
leaves the previous destination as it was and no partial file). Copying
in skips symlinks and special files with a warning (the API makes regular files and directories).
`

// cmdCp is airlock cp.
func cmdCp(args []string) int {
	r := newRemote("cp", cpUsage)
	c, code := r.parse(args)
	if c == nil {
		return code
	}
	if !r.args(2, 2) {
		return r.usageError("takes a source and a destination")
	}
	src, dst := r.arg(0), r.arg(1)
	sid, spath, sRemote := remotePath(src)
	did, dpath, dRemote := remotePath(dst)
	ctx, stop, caught := interruptContext()
	defer stop()
	var err error
	switch {
	case sRemote == dRemote:
		return r.usageError("one of the two must be SANDBOX:PATH and the other local")
	case sRemote:
		err = copyOut(ctx, c, sid, spath, dst)
	default:
		err = copyIn(ctx, c, src, did, dpath)
	}
	if err != nil {
		if s := caught(); s != nil {
			return interrupted("airlock cp", "the copy was stopped; no partial file was left", s)
		}
		return r.fail(err, nil)
	}
	return 0
}

// remotePath splits SANDBOX:PATH; a local path has no colon before its
// first slash (./a:b and /x:y are local).
func remotePath(arg string) (id, p string, ok bool) {
	i := strings.IndexByte(arg, ':')
	if i <= 0 || strings.ContainsRune(arg[:i], '/') {
		return "", "", false
	}
	p = arg[i+1:]
	if !strings.HasPrefix(p, "/") {
		p = path.Join("/workspace", p)
	}
	return arg[:i], p, true
}

// copyIn copies local file or tree src (or - for stdin) to sandbox path dst.
func copyIn(ctx context.Context, c *client.Client, src, id, dst string) error {
	if src == "-" {
		_, err := c.WriteFile(ctx, id, dst, os.Stdin, 0)
		return err
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if st, err := c.Stat(ctx, id, dst); err == nil && st.Type == "dir" {
		dst = path.Join(dst, filepath.Base(filepath.Clean(src)))
	} else if err != nil && client.StatusOf(err) != 404 {
		return err
	}
	if !fi.IsDir() {
		return copyFileIn(ctx, c, src, fi, id, dst)
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := path.Join(dst, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return c.Mkdir(ctx, id, target)
		case info.Mode().IsRegular():
			return copyFileIn(ctx, c, p, info, id, target)
		default:
			fmt.Fprintf(os.Stderr, "airlock cp: skipped %s: a %s, not a regular file\n", p, kindOf(info.Mode()))
			return nil
		}
	})
}

func kindOf(m fs.FileMode) string {
	if m&fs.ModeSymlink != 0 {
		return "symlink"
	}
	return "special file"
}

func copyFileIn(ctx context.Context, c *client.Client, src string, fi fs.FileInfo, id, dst string) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: a %s, not a regular file", src, kindOf(fi.Mode()))
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = c.WriteFile(ctx, id, dst, f, uint32(fi.Mode().Perm()))
	return err
}

// copyOut copies sandbox path src to local dst (- for stdout).
func copyOut(ctx context.Context, c *client.Client, id, src, dst string) error {
	st, err := c.Stat(ctx, id, src)
	if err != nil {
		return err
	}
	if dst == "-" {
		if st.Type != "file" {
			return fmt.Errorf("%s:%s is a %s: only a file goes to stdout", id, src, st.Type)
		}
		rc, err := c.OpenFile(ctx, id, src)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(os.Stdout, rc)
		return err
	}
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = filepath.Join(dst, path.Base(src))
	}
	// Everything is made under a temporary name in dst's directory and
	// renamed into place at the end, through an os.Root of that directory:
	// no name the sandbox chose can reach outside it.
	parent, base := filepath.Dir(dst), filepath.Base(dst)
	root, err := os.OpenRoot(parent)
	if err != nil {
		return err
	}
	defer root.Close()
	tmp := ".airlock-cp-" + randomSuffix() + "-" + base
	defer root.RemoveAll(tmp) // gone once renamed; left only on failure
	o := outCopier{ctx: ctx, c: c, id: id, root: root, top: tmp}
	switch st.Type {
	case "file":
		err = o.file(src, tmp, st.Mode)
	case "dir":
		if err = root.Mkdir(tmp, 0o700); err == nil {
			err = o.dir(src, tmp, 0)
		}
		if err == nil {
			err = root.Chmod(tmp, safeMode(st.Mode)|0o700)
		}
	default:
		return fmt.Errorf("%s:%s is a %s: not copied (copy what a symlink points to)", id, src, st.Type)
	}
	if err != nil {
		return err
	}
	if fi, err := root.Lstat(base); err == nil && fi.IsDir() && st.Type == "dir" {
		return fmt.Errorf("%s exists: remove it or name another destination", dst)
	}
	return root.Rename(tmp, base)
}

// outCopier copies a sandbox tree into root.
type outCopier struct {
	ctx  context.Context
	c    *client.Client
	id   string
	root *os.Root
	top  string // the tree's top in root
}

// maxCopyDepth bounds how deep a tree copied out may nest.
const maxCopyDepth = 256

func (o outCopier) dir(src, dst string, depth int) error {
	if depth > maxCopyDepth {
		return fmt.Errorf("%s: nested more than %d levels: not copied", src, maxCopyDepth)
	}
	ents, err := o.c.ListFiles(o.ctx, o.id, src, 1)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || path.Clean(e.Path) != path.Join(src, name) {
			return fmt.Errorf("the server listed %q under %s: not a name in that directory; copy refused", e.Path, src)
		}
		from, to := path.Join(src, name), filepath.Join(dst, name)
		switch e.Type {
		case "dir":
			if err := o.root.Mkdir(to, 0o700); err != nil {
				return err
			}
			if err := o.dir(from, to, depth+1); err != nil {
				return err
			}
			if err := o.root.Chmod(to, safeMode(e.Mode)|0o700); err != nil {
				return err
			}
		case "file":
			if err := o.file(from, to, e.Mode); err != nil {
				return err
			}
		case "symlink":
			if !inside(o.top, to, e.Target) {
				fmt.Fprintf(os.Stderr, "airlock cp: skipped %s:%s: a symlink to %q, outside what is copied\n", o.id, from, e.Target)
				continue
			}
			if err := o.root.Symlink(e.Target, to); err != nil {
				return err
			}
		default:
			fmt.Fprintf(os.Stderr, "airlock cp: skipped %s:%s: a %s\n", o.id, from, e.Type)
		}
	}
	return nil
}

func (o outCopier) file(src, dst string, mode uint32) error {
	rc, err := o.c.OpenFile(o.ctx, o.id, src)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := o.root.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, safeMode(mode))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return fmt.Errorf("%s:%s: %w", o.id, src, err)
	}
	return f.Close()
}

// inside reports whether symlink link (a path under top) pointing to
// target stays inside top: a relative target that does not climb out. A
// link the sandbox planted towards a host path (/home/..., ../../..) would
// otherwise lead a later copy or edit on the host through it.
func inside(top, link, target string) bool {
	if target == "" || filepath.IsAbs(target) {
		return false
	}
	rel, err := filepath.Rel(top, filepath.Join(filepath.Dir(link), target))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// safeMode keeps a sandbox file's permission bits, never set-id or sticky.
func safeMode(m uint32) fs.FileMode { return fs.FileMode(m) & fs.ModePerm }

func randomSuffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// contextFiles reads a build context's regular files (relative path to
// content), leaving out symlinks, special files and .git, and refuses more
// than limit bytes.
func contextFiles(dir string, limit int) (map[string][]byte, error) {
	files := map[string][]byte{}
	total := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if total += len(b); total > limit {
			return errors.New("more than the 1 MiB a request takes: build with 'airlock template build' on the server's host, or trim the context")
		}
		files[filepath.ToSlash(rel)] = b
		return nil
	})
	return files, err
}
