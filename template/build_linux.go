// Package template builds images from Dockerfiles (parsed with BuildKit's
// parser): FROM an image, RUN in an airlock sandbox made from the image so
// far (same isolation as any sandbox; no network), COPY/ADD of local files
// from the build context, ENV, WORKDIR, USER, ARG, CMD, ENTRYPOINT. Every
// step is an image in the store, cached by its parent and its instruction
// (and, for COPY, the files' contents): a rebuild with nothing changed
// reuses every step.
package template

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"

	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/idrange"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// Options configure Build.
type Options struct {
	// Dockerfile is the Dockerfile's path; Context the directory COPY and
	// ADD read from.
	Dockerfile, Context string
	// Name names the result.
	Name string
	// Store holds the images; StateDir/roots the RUN steps' roots. Its
	// view's owner (imagestore.Store.As) owns the result and every step,
	// and FROM finds that owner's and public images only.
	Store    *imagestore.Store
	StateDir string
	// Policy is the sandbox policy of RUN steps (limits, profile, and
	// Runtime: the tier RUN steps run under, "" native); the image's user
	// and env apply on top.
	Policy policy.Policy
	// Args are --build-arg values.
	Args map[string]string
	// NoCache rebuilds every step.
	NoCache bool
	// Log receives the build log (steps, RUN output).
	Log io.Writer
	// Prepare, if set, readies each RUN step's sandbox (the CLI gives it
	// network through the egress proxy, as for airlock run --net); the
	// returned func runs after the step.
	Prepare func(p *policy.Policy, cfg *native.Config, opts *native.RunOptions) (func(), error)
	// AllowPull, if set, vets a FROM image that is not in the store before
	// it is pulled (the server's registry allowlist).
	AllowPull func(ref string) error
}

// Result is a finished build.
type Result struct {
	Image  *imagestore.Image
	Steps  int
	Cached int
}

var cacheMu sync.Mutex

// cacheFile maps step keys to image digests.
func cacheFile(o *Options) string { return filepath.Join(o.Store.Dir(), "buildcache.json") }

func cacheGet(o *Options, key string) *imagestore.Image {
	cacheMu.Lock()
	defer cacheMu.Unlock()
	b, err := os.ReadFile(cacheFile(o))
	if err != nil {
		return nil
	}
	var m map[string]string
	if json.Unmarshal(b, &m) != nil || m[key] == "" {
		return nil
	}
	img, err := o.Store.Get(m[key])
	if err != nil {
		return nil
	}
	return img
}

func cachePut(o *Options, key, digest string) error {
	cacheMu.Lock()
	defer cacheMu.Unlock()
	m := map[string]string{}
	if b, err := os.ReadFile(cacheFile(o)); err == nil {
		_ = json.Unmarshal(b, &m)
	}
	m[key] = digest
	b, _ := json.Marshal(m)
	tmp := cacheFile(o) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, cacheFile(o))
}

// Build builds o.Dockerfile.
// Build builds o.Dockerfile.
func Build(ctx context.Context, o Options) (*Result, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	f, err := os.Open(o.Dockerfile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ast, steps, err := parseDockerfile(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Dockerfile, err)
	}
	st := newBuildState(ast.EscapeToken, o.Args)
	var cur *imagestore.Image
	res := &Result{}
	for i, s := range steps {
		n := s.node
		fmt.Fprintf(o.Log, "step %d/%d: %s\n", i+1, len(steps), n.Original)
		res.Steps++
		if a, ok := s.cmd.(*instructions.ArgCommand); ok {
			var env []string
			if cur != nil {
				env = cur.Config.Env
			}
			if err := st.arg(a, env, cur == nil); err != nil {
				return nil, fmt.Errorf("line %d: ARG: %w", n.StartLine, err)
			}
			continue
		}
		if from, ok := s.cmd.(*instructions.Stage); ok {
			if cur != nil {
				return nil, fmt.Errorf("line %d: multi-stage builds are not supported", n.StartLine)
			}
			if cur, err = o.from(ctx, st, from); err != nil {
				return nil, fmt.Errorf("line %d: %w", n.StartLine, err)
			}
			continue
		}
		if cur == nil {
			return nil, fmt.Errorf("line %d: %s before FROM", n.StartLine, strings.ToUpper(n.Value))
		}
		next, cached, err := o.step(ctx, st, cur, s)
		if err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", n.StartLine, strings.ToUpper(n.Value), err)
		}
		if cached {
			fmt.Fprintf(o.Log, " ---> cached %s\n", next.Digest[:19])
			res.Cached++
		} else {
			fmt.Fprintf(o.Log, " ---> %s\n", next.Digest[:19])
		}
		cur = next
	}
	if cur == nil {
		return nil, errors.New("the Dockerfile has no FROM")
	}
	if unused := st.unusedArgs(); len(unused) > 0 {
		fmt.Fprintf(o.Log, "warning: --build-arg %s: no ARG declares it (not used)\n", strings.Join(unused, ", "))
	}
	if o.Name != "" {
		if cur, err = o.Store.Tag(ctx, cur, o.Name); err != nil {
			return nil, err
		}
	}
	res.Image = cur
	return res, nil
}

// from resolves FROM (one stage): the image from the store, or pulled.
func (o *Options) from(ctx context.Context, st *buildState, from *instructions.Stage) (*imagestore.Image, error) {
	if from.Platform != "" {
		return nil, errors.New("FROM --platform is not supported")
	}
	var meta []string
	for _, k := range sortedKeys(st.meta) {
		meta = append(meta, k+"="+st.meta[k])
	}
	ref, err := st.expander(meta)(from.BaseName)
	if err != nil {
		return nil, fmt.Errorf("FROM: %w", err)
	}
	img, err := o.Store.Get(ref)
	if errors.Is(err, imagestore.ErrNotFound) {
		if o.AllowPull != nil {
			if err := o.AllowPull(ref); err != nil {
				return nil, fmt.Errorf("FROM %s: %w", ref, err)
			}
		}
		img, err = o.Store.Pull(ctx, ref, imagestore.PullOptions{})
		if err != nil && !imagestore.HasRegistry(ref) {
			err = fmt.Errorf("not in the local store ('airlock image ls' lists it), and pulling it from Docker Hub failed: %w", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("FROM %s: %w", ref, err)
	}
	return img, nil
}

// step makes the image of one instruction after FROM on cur, or takes it
// from the cache; cached says which.
func (o *Options) step(ctx context.Context, st *buildState, cur *imagestore.Image, s step) (img *imagestore.Image, cached bool, err error) {
	// The cache key: parent, instruction, ARGs in scope, and COPY's files.
	h := sha256.New()
	// Per owner: a step another key ran (a RUN's random output, a key it
	// generated) is never handed to this one.
	if ow := o.Store.Owner(); ow != "" {
		fmt.Fprintf(h, "owner=%s\n", ow)
	}
	fmt.Fprintf(h, "%s\n%s\n", cur.Digest, s.node.Original)
	for _, k := range sortedKeys(st.args) {
		fmt.Fprintf(h, "%s=%s\n", k, st.args[k])
	}
	var copyTar string
	switch c := s.cmd.(type) {
	case *instructions.CopyCommand:
		if c.From != "" || c.Chown != "" || c.Chmod != "" || c.Link || c.Parents || len(c.ExcludePatterns) > 0 {
			return nil, false, errors.New("flags (--from, --chown, --chmod, --link, --parents, --exclude) are not supported")
		}
		copyTar, err = o.copySources(st, cur, &c.SourcesAndDest, h, "COPY")
	case *instructions.AddCommand:
		if c.Chown != "" || c.Chmod != "" || c.Link || len(c.ExcludePatterns) > 0 || c.Checksum != "" || c.KeepGitDir != nil || c.Unpack != nil {
			return nil, false, errors.New("flags (--chown, --chmod, --link, --exclude, --checksum, --keep-git-dir, --unpack) are not supported")
		}
		copyTar, err = o.copySources(st, cur, &c.SourcesAndDest, h, "ADD")
	case *instructions.RunCommand:
		if len(c.FlagsUsed) > 0 {
			err = fmt.Errorf("flags (--%s) are not supported", strings.Join(c.FlagsUsed, ", --"))
		}
	}
	if err != nil {
		return nil, false, err
	}
	if copyTar != "" {
		defer os.Remove(copyTar)
	}
	key := hex.EncodeToString(h.Sum(nil))
	if !o.NoCache {
		if img := cacheGet(o, key); img != nil {
			st.replay(s.cmd)
			return img, true, nil
		}
	}
	switch c := s.cmd.(type) {
	case *instructions.RunCommand:
		img, err = o.run(ctx, st, cur, c)
	case *instructions.CopyCommand, *instructions.AddCommand:
		img, err = o.Store.AppendTar(ctx, cur, copyTar, "", s.node.Original)
	case *instructions.WorkdirCommand:
		img, err = o.workdir(ctx, st, cur, c, s.node.Original)
	case instructions.Command:
		img, err = o.configure(ctx, st, cur, c, s.node.Original)
	default:
		err = fmt.Errorf("%T is not supported", c)
	}
	if err != nil {
		return nil, false, err
	}
	if err := cachePut(o, key, img.Digest); err != nil {
		return nil, false, err
	}
	return img, false, nil
}

// configure makes the image of a config-only instruction.
func (o *Options) configure(ctx context.Context, st *buildState, cur *imagestore.Image, cmd instructions.Command, createdBy string) (*imagestore.Image, error) {
	var ferr error
	img, err := o.Store.Configure(ctx, cur, "", createdBy, func(c *v1.Config) { ferr = st.configure(c, cmd) })
	if ferr != nil {
		return nil, ferr
	}
	return img, err
}

// workdir sets WORKDIR and, as BuildKit does, creates the directory (with
// its parents) owned by the image's USER (numeric; else root) when the
// image lacks it. A directory under one a sandbox mounts over is named in
// a warning: it will not exist in sandboxes.
func (o *Options) workdir(ctx context.Context, st *buildState, cur *imagestore.Image, c *instructions.WorkdirCommand, createdBy string) (*imagestore.Image, error) {
	expanded := *c // configure expands c itself: expand a copy (once each)
	if err := expanded.Expand(st.expander(st.env(cur.Config.Env))); err != nil {
		return nil, err
	}
	dir := workdir(cur.Config.WorkingDir, expanded.Path)
	if m := MaskedBy(dir); m != "" {
		if dir != m {
			fmt.Fprintf(o.Log, "warning: WORKDIR %s: sandboxes mount their own %s, so this directory will not exist in them\n", dir, m)
		}
	} else if t, err := dirTar(cur, dir); err != nil {
		return nil, err
	} else if t != "" {
		defer os.Remove(t)
		if cur, err = o.Store.AppendTar(ctx, cur, t, "", createdBy); err != nil {
			return nil, err
		}
	}
	return o.configure(ctx, st, cur, c, createdBy)
}

// imageStat reports whether img has path p (absolute) and whether it is a
// directory, looking through its layers from the top (a whiteout hides
// it; the lookup never leaves a layer's directory).
func imageStat(img *imagestore.Image, p string) (exists, isDir bool) {
	dirs := img.LayerDirs()
	rel := strings.TrimPrefix(path.Clean(p), "/")
	if rel == "" {
		return true, true
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		root, err := os.OpenRoot(dirs[i])
		if err != nil {
			continue
		}
		fi, err := root.Lstat(rel)
		root.Close()
		if err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0 {
				return false, false // overlayfs whiteout
			}
			return true, fi.IsDir() || fi.Mode()&fs.ModeSymlink != 0 // a link is followed at run time
		}
	}
	return false, false
}

// dirTar writes a layer tar holding the components of dir that img lacks,
// owned by img's numeric USER; "" when it has them all.
func dirTar(img *imagestore.Image, dir string) (string, error) {
	var missing []string
	for d := dir; d != "/"; d = path.Dir(d) {
		if exists, isDir := imageStat(img, d); exists && !isDir {
			return "", fmt.Errorf("%s is not a directory in the image", d)
		} else if exists {
			break
		}
		missing = append([]string{d}, missing...)
	}
	if len(missing) == 0 {
		return "", nil
	}
	uid, gid := 0, 0
	us, gs, _ := strings.Cut(img.Config.User, ":")
	if n, err := strconv.Atoi(us); err == nil && n >= 0 {
		uid, gid = n, n
		if g, err := strconv.Atoi(gs); err == nil && g >= 0 {
			gid = g
		}
	}
	tmp, err := os.CreateTemp("", "airlock-workdir-")
	if err != nil {
		return "", err
	}
	defer tmp.Close()
	tw := tar.NewWriter(tmp)
	for _, d := range missing {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, Uid: uid, Gid: gid}); err != nil {
			os.Remove(tmp.Name())
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return tmp.Name(), nil
}

// run executes a RUN step in a sandbox made from cur and commits what it
// changed.
func (o *Options) run(ctx context.Context, st *buildState, cur *imagestore.Image, c *instructions.RunCommand) (*imagestore.Image, error) {
	argv, err := st.argv(c.ShellDependantCmdLine)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, errors.New("RUN needs a command")
	}
	if m := mentionsMasked(strings.Join(c.CmdLine, " "), cur.Config.WorkingDir); m != "" {
		fmt.Fprintf(o.Log, "warning: RUN uses %s: every sandbox, and every RUN step, mounts its own %s, so files written there are not kept in the image (write them elsewhere, e.g. /opt or /var/tmp)\n", m, m)
	}
	p := o.Policy
	if err := cur.ApplyTo(&p); err != nil {
		return nil, err
	}
	if cur.Config.WorkingDir == "" {
		p.Filesystem.Workdir = "/" // BuildKit's default; /workspace would be a tmpfs
	}
	// As in Docker, a RUN step of the image's root is root with the root's
	// capabilities (of the sandbox's own user namespace): apt, dpkg, chown.
	p.User.Root = p.User.UID == 0 && p.User.GID == 0
	for k, v := range st.runEnv(cur.Config.Env) {
		p.SetEnv(k, v)
	}
	pool, err := idrange.Default()
	if err != nil {
		return nil, err
	}
	lease, err := pool.Acquire(os.Getpid(), 0, nil)
	if err != nil {
		return nil, err
	}
	defer lease.Release()
	id := native.NewRunID()
	dir := filepath.Join(o.StateDir, "roots", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	defer native.RemoveImageRoot(dir)
	if err := o.Store.Lease(id, cur, dir); err != nil {
		return nil, err
	}
	defer o.Store.Release(id)
	cfg := native.Config{ID: id, Policy: p, Args: argv, HostIDBase: lease.Base,
		Image: &native.ImageRoot{Layers: cur.LayerDirs(), Dir: dir}}
	ropts := native.RunOptions{Stdout: o.Log, Stderr: o.Log}
	if o.Prepare != nil {
		done, err := o.Prepare(&cfg.Policy, &cfg, &ropts)
		if err != nil {
			return nil, err
		}
		defer done()
	}
	t, err := tier.Lookup(p.Runtime)
	if err != nil {
		return nil, err
	}
	runner, ok := t.(tier.Runner)
	if !ok || !t.Caps().ImageRoots {
		return nil, fmt.Errorf("RUN steps cannot run under runtime %s (it runs no one-shot sandbox from an image root)", t.Name())
	}
	r, err := runner.Run(ctx, cfg, ropts)
	if err != nil {
		return nil, err
	}
	if r.Status != native.StatusOK {
		return nil, fmt.Errorf("%s: %s exit %d %s", strings.Join(argv, " "), r.Status, r.ExitCode, r.Error)
	}
	// The upper directory's owners: shifted into the lease's host range
	// (native: ID-mapped layers), or the sandbox's own ids (a tier whose
	// root is served unmapped, gvisor): the image is the same either way.
	idBase := lease.Base
	if t.Caps().UnmappedIDs {
		idBase = 0
	}
	return o.Store.Commit(ctx, cur, (&native.ImageRoot{Dir: dir}).UpperDir(), idBase, "")
}

// copySources writes COPY/ADD's sources from the build context as a layer
// tar at the destination and hashes them into h. Sources are paths (or
// glob patterns) inside the context: '..' is refused and symlinks are
// copied as symlinks, never followed (a context cannot leak host files
// into the image). A destination a sandbox mounts over is refused: the
// files would silently never be seen.
func (o *Options) copySources(st *buildState, cur *imagestore.Image, sd *instructions.SourcesAndDest, h io.Writer, instr string) (string, error) {
	if len(sd.SourceContents) > 0 {
		return "", errors.New("heredocs are not supported")
	}
	if err := sd.Expand(st.expander(st.env(cur.Config.Env))); err != nil {
		return "", err
	}
	dest := sd.DestPath
	if !path.IsAbs(dest) {
		slash := strings.HasSuffix(dest, "/")
		dest = path.Join("/", cur.Config.WorkingDir, dest)
		if slash {
			dest += "/"
		}
	}
	if m := MaskedBy(dest); m != "" {
		return "", fmt.Errorf("%s into %s: every sandbox mounts its own %s (a fresh tmpfs for /tmp, /workspace and /dev/shm), so the files would never be seen; copy them to another directory such as /opt/app", instr, dest, m)
	}
	root, err := os.OpenRoot(o.Context)
	if err != nil {
		return "", err
	}
	defer root.Close()
	var srcs []string
	for _, s := range sd.SourcePaths {
		if instr == "ADD" && (strings.Contains(s, "://") || strings.HasPrefix(s, "git@")) {
			return "", fmt.Errorf("%s: ADD from a URL is not supported (a build fetches nothing); download it in a RUN step given network with --net", s)
		}
		rel := path.Clean(strings.TrimPrefix(s, "/"))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return "", fmt.Errorf("%s is outside the build context", s)
		}
		if !strings.ContainsAny(rel, "*?[") {
			srcs = append(srcs, rel)
			continue
		}
		matches, err := fs.Glob(root.FS(), rel)
		if err != nil {
			return "", fmt.Errorf("%s: %w", s, err)
		}
		if len(matches) == 0 {
			return "", fmt.Errorf("%s: no file in the build context matches", s)
		}
		srcs = append(srcs, matches...)
	}
	multi := len(srcs) > 1 || len(sd.SourcePaths) > 1
	if multi && !strings.HasSuffix(sd.DestPath, "/") {
		return "", fmt.Errorf("with more than one source the destination must be a directory ending in /: %s", sd.DestPath)
	}
	tmp, err := os.CreateTemp("", "airlock-copy-")
	if err != nil {
		return "", err
	}
	defer tmp.Close()
	if err := writeContext(root, tmp, srcs, dest, multi, h, instr == "ADD"); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return tmp.Name(), nil
}

// writeContext writes srcs (relative to root) as a tar to w at dest.
func writeContext(root *os.Root, w io.Writer, srcs []string, dest string, multi bool, h io.Writer, add bool) error {
	// The layer keeps the files' modification times, but the cache key
	// does not: a context written afresh for every build (the API's) must
	// still hit the cache. h gets names, modes, link targets and contents.
	tw := tar.NewWriter(w)
	file := func(rel, name string, fi fs.FileInfo) error {
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = strings.TrimPrefix(name, "/"), 0, 0, "", ""
		hdr.ModTime = fi.ModTime().Truncate(1e9)
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if hdr.Linkname, err = root.Readlink(rel); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		fmt.Fprintf(h, "%q %c %o %d %q\n", hdr.Name, hdr.Typeflag, hdr.Mode, hdr.Size, hdr.Linkname)
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := root.Open(rel)
		if err != nil {
			return err
		}
		defer f.Close()
		if add {
			if err := refuseArchive(f, rel); err != nil {
				return err
			}
		}
		_, err = io.Copy(io.MultiWriter(tw, h), f)
		return err
	}
	for _, rel := range srcs {
		fi, err := root.Lstat(rel)
		if err != nil {
			return err
		}
		target := dest
		if !fi.IsDir() && (strings.HasSuffix(dest, "/") || multi) {
			target = path.Join(dest, path.Base(rel))
		}
		if !fi.IsDir() {
			err = file(rel, target, fi)
		} else {
			err = fs.WalkDir(root.FS(), rel, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				info, err := root.Lstat(p)
				if err != nil {
					return err
				}
				sub := strings.TrimPrefix(strings.TrimPrefix(p, rel), "/")
				return file(p, path.Join(target, sub), info)
			})
		}
		if err != nil {
			return err
		}
	}
	return tw.Close()
}

// refuseArchive refuses ADD of a local archive, which BuildKit would
// unpack and airlock does not (it would copy the archive as it is);
// f is left at its start.
func refuseArchive(f *os.File, rel string) error {
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	for _, magic := range [][]byte{{0x1f, 0x8b}, []byte("BZh"), {0xfd, '7', 'z', 'X', 'Z', 0}, {0x28, 0xb5, 0x2f, 0xfd}} {
		if bytes.HasPrefix(head, magic) {
			return fmt.Errorf("%s: ADD of an archive is not supported (BuildKit would unpack it; airlock does not): COPY it and unpack it in a RUN step", rel)
		}
	}
	if len(head) >= 262 && string(head[257:262]) == "ustar" {
		return fmt.Errorf("%s: ADD of a tar archive is not supported (BuildKit would unpack it; airlock does not): COPY it and unpack it in a RUN step", rel)
	}
	return nil
}
