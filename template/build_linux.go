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
	"sort"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"airlock/imagestore"
	"airlock/policy"
	"airlock/runtime/native"
	"airlock/runtime/native/idrange"
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
	// Policy is the sandbox policy of RUN steps (limits, profile); the
	// image's user and env apply on top.
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
func Build(ctx context.Context, o Options) (*Result, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	f, err := os.Open(o.Dockerfile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ast, err := parser.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Dockerfile, err)
	}
	args := map[string]string{}
	lex := shell.NewLex('\\')
	expand := func(s string, env []string) (string, error) {
		all := append([]string{}, env...)
		for k, v := range args {
			all = append(all, k+"="+v)
		}
		r, err := lex.ProcessWordWithMatches(s, shell.EnvsFromSlice(all))
		return r.Result, err
	}
	var cur *imagestore.Image
	res := &Result{}
	for i, n := range ast.AST.Children {
		instr := strings.ToUpper(n.Value)
		var words []string
		for w := n.Next; w != nil; w = w.Next {
			words = append(words, w.Value)
		}
		fmt.Fprintf(o.Log, "step %d/%d: %s\n", i+1, len(ast.AST.Children), n.Original)
		res.Steps++
		if instr == "ARG" {
			for _, w := range words {
				k, v, _ := strings.Cut(w, "=")
				if given, ok := o.Args[k]; ok {
					v = given
				}
				args[k] = v
			}
			continue
		}
		if instr == "FROM" {
			if cur != nil {
				return nil, fmt.Errorf("line %d: multi-stage builds are not supported", n.StartLine)
			}
			if len(words) != 1 {
				return nil, fmt.Errorf("line %d: FROM takes one image (no AS, no --platform)", n.StartLine)
			}
			ref, err := expand(words[0], nil)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n.StartLine, err)
			}
			if cur, err = o.Store.Get(ref); errors.Is(err, imagestore.ErrNotFound) {
				if o.AllowPull != nil {
					if err := o.AllowPull(ref); err != nil {
						return nil, fmt.Errorf("line %d: FROM %s: %w", n.StartLine, ref, err)
					}
				}
				cur, err = o.Store.Pull(ctx, ref, imagestore.PullOptions{})
			}
			if err != nil {
				return nil, fmt.Errorf("line %d: FROM %s: %w", n.StartLine, ref, err)
			}
			continue
		}
		if cur == nil {
			return nil, fmt.Errorf("line %d: %s before FROM", n.StartLine, instr)
		}
		// The cache key: parent, instruction, build args, and COPY's files.
		h := sha256.New()
		// Per owner: a step another key ran (a RUN's random output, a
		// key it generated) is never handed to this one.
		if ow := o.Store.Owner(); ow != "" {
			fmt.Fprintf(h, "owner=%s\n", ow)
		}
		fmt.Fprintf(h, "%s\n%s\n", cur.Digest, n.Original)
		for _, k := range sortedKeys(args) {
			fmt.Fprintf(h, "%s=%s\n", k, args[k])
		}
		var copyTar string
		if instr == "COPY" || instr == "ADD" {
			if copyTar, err = contextTar(&o, words, h, n.StartLine, cur, expand); err != nil {
				return nil, err
			}
			defer os.Remove(copyTar)
		}
		key := hex.EncodeToString(h.Sum(nil))
		if !o.NoCache {
			if img := cacheGet(&o, key); img != nil {
				fmt.Fprintf(o.Log, " ---> cached %s\n", img.Digest[:19])
				cur = img
				res.Cached++
				continue
			}
		}
		var next *imagestore.Image
		switch instr {
		case "RUN":
			next, err = run(ctx, &o, cur, n, words, expand)
		case "COPY", "ADD":
			next, err = o.Store.AppendTar(ctx, cur, copyTar, "", n.Original)
		case "ENV", "WORKDIR", "USER", "CMD", "ENTRYPOINT", "LABEL", "EXPOSE":
			next, err = configure(ctx, &o, cur, instr, n, words, expand)
		default:
			err = fmt.Errorf("%s is not supported", instr)
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", n.StartLine, instr, err)
		}
		if err := cachePut(&o, key, next.Digest); err != nil {
			return nil, err
		}
		fmt.Fprintf(o.Log, " ---> %s\n", next.Digest[:19])
		cur = next
	}
	if cur == nil {
		return nil, errors.New("the Dockerfile has no FROM")
	}
	if o.Name != "" {
		if cur, err = o.Store.Tag(ctx, cur, o.Name); err != nil {
			return nil, err
		}
	}
	res.Image = cur
	return res, nil
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// configure applies a config instruction.
func configure(ctx context.Context, o *Options, cur *imagestore.Image, instr string, n *parser.Node, words []string, expand func(string, []string) (string, error)) (*imagestore.Image, error) {
	var ferr error
	img, err := o.Store.Configure(ctx, cur, "", n.Original, func(c *v1.Config) {
		x := func(s string) string {
			r, err := expand(s, c.Env)
			if err != nil && ferr == nil {
				ferr = err
			}
			return r
		}
		switch instr {
		case "ENV":
			for i := 0; i+1 < len(words); i += 2 { // the parser gives key, value pairs
				setEnv(c, words[i], x(words[i+1]))
			}
		case "WORKDIR":
			w := x(words[0])
			if !path.IsAbs(w) {
				w = path.Join("/", c.WorkingDir, w)
			}
			c.WorkingDir = w
		case "USER":
			c.User = x(words[0])
		case "CMD", "ENTRYPOINT":
			args := words
			if n.Attributes["json"] == false {
				args = []string{"/bin/sh", "-c", strings.Join(words, " ")}
			}
			if instr == "CMD" {
				c.Cmd = args
			} else {
				c.Entrypoint = args
			}
		}
	})
	if ferr != nil {
		return nil, ferr
	}
	return img, err
}

func setEnv(c *v1.Config, k, v string) {
	for i, kv := range c.Env {
		if strings.HasPrefix(kv, k+"=") {
			c.Env[i] = k + "=" + v
			return
		}
	}
	c.Env = append(c.Env, k+"="+v)
}

// run executes a RUN step in a sandbox made from cur and commits what it
// changed.
func run(ctx context.Context, o *Options, cur *imagestore.Image, n *parser.Node, words []string, expand func(string, []string) (string, error)) (*imagestore.Image, error) {
	argv := words
	if n.Attributes["json"] == false {
		argv = []string{"/bin/sh", "-c", strings.Join(words, " ")}
	}
	p := o.Policy
	if err := cur.ApplyTo(&p); err != nil {
		return nil, err
	}
	// As in Docker, a RUN step of the image's root is root with the root's
	// capabilities (of the sandbox's own user namespace): apt, dpkg, chown.
	p.User.Root = p.User.UID == 0 && p.User.GID == 0
	for k, v := range o.Args {
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
	r, err := native.Run(ctx, cfg, ropts)
	if err != nil {
		return nil, err
	}
	if r.Status != native.StatusOK {
		return nil, fmt.Errorf("%s: %s exit %d %s", strings.Join(argv, " "), r.Status, r.ExitCode, r.Error)
	}
	return o.Store.Commit(ctx, cur, (&native.ImageRoot{Dir: dir}).UpperDir(), lease.Base, "")
}

// contextTar writes COPY/ADD's sources from the build context as a layer
// tar at the destination and hashes them into h. Sources are paths inside
// the context: '..' is refused and symlinks are copied as symlinks, never
// followed (a context cannot leak host files into the image).
func contextTar(o *Options, words []string, h io.Writer, line int, cur *imagestore.Image, expand func(string, []string) (string, error)) (string, error) {
	var srcs []string
	for _, w := range words {
		if strings.HasPrefix(w, "--") {
			return "", fmt.Errorf("line %d: COPY/ADD flags (%s) are not supported", line, w)
		}
		srcs = append(srcs, w)
	}
	if len(srcs) < 2 {
		return "", fmt.Errorf("line %d: COPY needs a source and a destination", line)
	}
	dest, err := expand(srcs[len(srcs)-1], cur.Config.Env)
	if err != nil {
		return "", err
	}
	if !path.IsAbs(dest) {
		dest = path.Join("/", cur.Config.WorkingDir, dest)
	}
	srcs = srcs[:len(srcs)-1]
	tmp, err := os.CreateTemp("", "airlock-copy-")
	if err != nil {
		return "", err
	}
	defer tmp.Close()
	// The layer keeps the files' modification times, but the cache key
	// does not: a context written afresh for every build (the API's) must
	// still hit the cache. h gets names, modes, link targets and contents.
	tw := tar.NewWriter(tmp)
	root, err := os.OpenRoot(o.Context)
	if err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	defer root.Close()
	add := func(rel, name string, fi fs.FileInfo) error {
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
		if fi.Mode().IsRegular() {
			f, err := root.Open(rel)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(io.MultiWriter(tw, h), f)
			return err
		}
		return nil
	}
	for _, s := range srcs {
		rel := path.Clean(strings.TrimPrefix(s, "/"))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			os.Remove(tmp.Name())
			return "", fmt.Errorf("line %d: %s is outside the build context", line, s)
		}
		fi, err := root.Lstat(rel)
		if err != nil {
			os.Remove(tmp.Name())
			return "", fmt.Errorf("line %d: %w", line, err)
		}
		target := dest
		if !fi.IsDir() && (strings.HasSuffix(dest, "/") || len(srcs) > 1) {
			target = path.Join(dest, path.Base(rel))
		}
		if !fi.IsDir() {
			err = add(rel, target, fi)
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
				return add(p, path.Join(target, sub), info)
			})
		}
		if err != nil {
			os.Remove(tmp.Name())
			return "", fmt.Errorf("line %d: %w", line, err)
		}
	}
	if err := tw.Close(); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return tmp.Name(), nil
}
