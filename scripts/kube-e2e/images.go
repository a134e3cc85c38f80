// Image building for kube-e2e (see main.go).

package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is every entry's modification time.
var epoch = time.Unix(1700000000, 0)

// libDirs are searched, in order, for a shared library named by DT_NEEDED.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib", "/lib"}

// cmdImage is "kube-e2e image": it builds one image tarball.
func cmdImage(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	kind := fs.String("kind", "", "agent, sandbox or pause")
	ref := fs.String("ref", "", "image reference to tag the image with (e.g. localhost/airlock-agent:e2e)")
	out := fs.String("out", "", "tarball to write")
	airlock := fs.String("airlock", "", "static airlock binary (kind agent)")
	busybox := fs.String("busybox", "/bin/busybox", "static busybox (kinds sandbox and pause)")
	python := fs.String("python", "/usr/bin/python3", "python3 to copy with its libraries (kind sandbox)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return buildImage(*kind, *ref, *out, *airlock, *busybox, *python)
}

// buildImage writes the image of kind as a tarball tagged ref.
func buildImage(kind, ref, out, airlock, busybox, python string) error {
	if ref == "" || out == "" {
		return errors.New("-ref and -out are required")
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	l := newLayer()
	cfg := v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}}
	switch kind {
	case "agent":
		if airlock == "" {
			return errors.New("-kind agent needs -airlock")
		}
		if err := requireStatic(airlock); err != nil {
			return err
		}
		if err := l.file(airlock, "/airlock", 0o555); err != nil {
			return err
		}
		cfg.Entrypoint = []string{"/airlock"}
	case "pause":
		if err := addBusybox(l, busybox, nil); err != nil {
			return err
		}
		cfg.Entrypoint = []string{"/bin/busybox", "sleep", "2147483647"}
	case "sandbox":
		if err := sandbox(l, busybox, python); err != nil {
			return err
		}
		cfg.Cmd = []string{"/bin/sh"}
		cfg.WorkingDir = "/"
	default:
		return fmt.Errorf("-kind %q: want agent, sandbox or pause", kind)
	}
	raw, err := l.close()
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		// Fast compression: the tarball is imported once, on this host.
		tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", "amd64", v1.Time{Time: epoch}
	cf.Config = cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}

// requireStatic refuses a dynamically linked binary: the agent image has no
// libraries, and the agent must run in any user image.
func requireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}

// sandbox fills l with busybox, python3 and its closure, and the few files a
// Linux user needs.
func sandbox(l *layer, busybox, python string) error {
	if err := addBusybox(l, busybox, map[string]bool{"python3": true}); err != nil {
		return err
	}
	pyReal, err := filepath.EvalSymlinks(python)
	if err != nil {
		return fmt.Errorf("python3: %w", err)
	}
	base := filepath.Base(pyReal) // python3.11
	if err := l.file(pyReal, pyReal, 0o755); err != nil {
		return err
	}
	if pyReal != "/usr/bin/python3" {
		l.symlink("/usr/bin/python3", base)
	}
	objs := []string{pyReal}
	stdlib := filepath.Join("/usr/lib", base)
	err = filepath.WalkDir(stdlib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, stdlib+"/")
		if d.IsDir() && (d.Name() == "__pycache__" || rel == "test" || rel == "idlelib" || rel == "tkinter" || rel == "turtledemo") {
			return filepath.SkipDir
		}
		switch {
		case d.IsDir():
			l.dir(p, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			l.symlink(p, t)
		case d.Type().IsRegular():
			if strings.HasSuffix(p, ".so") {
				if strings.Contains(d.Name(), "_tkinter") {
					return nil // needs X11 libraries; nothing here uses it
				}
				objs = append(objs, p)
			}
			return l.file(p, p, 0o644|0o111*boolMode(strings.HasSuffix(p, ".so")))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("python standard library %s: %w", stdlib, err)
	}
	libs, err := closure(objs)
	if err != nil {
		return err
	}
	for _, lib := range libs {
		if err := l.file(lib, lib, 0o755); err != nil {
			return err
		}
	}
	l.dir("/tmp", 0o1777)
	l.dir("/root", 0o700)
	l.dirOwned("/home/user", 0o755, 1000)
	l.data("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", 0o644)
	l.data("/etc/group", "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n", 0o644)
	return nil
}

func boolMode(b bool) fs.FileMode {
	if b {
		return 1
	}
	return 0
}

// addBusybox adds a static busybox at /bin/busybox with a symlink per applet
// in /bin (except the names in skip), /bin/sh among them.
func addBusybox(l *layer, busybox string, skip map[string]bool) error {
	if err := requireStatic(busybox); err != nil {
		return err
	}
	if err := l.file(busybox, "/bin/busybox", 0o755); err != nil {
		return err
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %w", busybox, err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" && !skip[applet] && !strings.Contains(applet, "/") {
			l.symlink("/bin/"+applet, "busybox")
		}
	}
	return nil
}

// closure returns the dynamic loader and every shared library the ELF
// objects load, directly or through another library, sorted.
func closure(objs []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	queue := append([]string(nil), objs...)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		f, err := elf.Open(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		needed, err := f.ImportedLibraries()
		var interp string
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				b, _ := io.ReadAll(prog.Open())
				interp = strings.TrimRight(string(b), "\x00")
			}
		}
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: needed libraries: %w", p, err)
		}
		if interp != "" && !seen[interp] {
			seen[interp] = true
			out = append(out, interp)
		}
		for _, n := range needed {
			lib, err := findLib(n)
			if err != nil {
				return nil, fmt.Errorf("%s needs %w", p, err)
			}
			if !seen[lib] {
				seen[lib] = true
				out = append(out, lib)
				queue = append(queue, lib)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

func findLib(n string) (string, error) {
	for _, d := range libDirs {
		p := filepath.Join(d, n)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s, found in none of %s", n, strings.Join(libDirs, ", "))
}

// layer is an uncompressed tar built in memory. Parent directories are
// added on first use; symlinked host paths are stored as regular files of
// their contents at the path given.
type layer struct {
	buf  bytes.Buffer
	tw   *tar.Writer
	dirs map[string]bool
	err  error
}

func newLayer() *layer {
	l := &layer{dirs: map[string]bool{"/": true}}
	l.tw = tar.NewWriter(&l.buf)
	return l
}

func (l *layer) header(h *tar.Header) {
	if l.err != nil {
		return
	}
	h.Name = strings.TrimPrefix(h.Name, "/")
	h.ModTime, h.Format = epoch, tar.FormatPAX
	l.err = l.tw.WriteHeader(h)
}

func (l *layer) parents(p string) {
	d := filepath.Dir(p)
	if l.dirs[d] {
		return
	}
	l.parents(d)
	l.dirs[d] = true
	l.header(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755})
}

func (l *layer) dirOwned(p string, mode int64, uid int) {
	if l.dirs[p] {
		return
	}
	l.parents(p)
	l.dirs[p] = true
	l.header(&tar.Header{Name: p + "/", Typeflag: tar.TypeDir, Mode: mode, Uid: uid, Gid: uid})
}

func (l *layer) dir(p string, mode int64) { l.dirOwned(p, mode, 0) }

func (l *layer) symlink(p, target string) {
	l.parents(p)
	l.header(&tar.Header{Name: p, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777})
}

func (l *layer) data(p, s string, mode int64) {
	l.parents(p)
	l.header(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(s))})
	if l.err == nil {
		_, l.err = io.WriteString(l.tw, s)
	}
}

// file copies the host file src (following symlinks) to dst.
func (l *layer) file(src, dst string, mode fs.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("read %s: %w", src, err)
	}
	l.data(dst, string(b), int64(mode))
	return l.err
}

func (l *layer) close() ([]byte, error) {
	if l.err == nil {
		l.err = l.tw.Close()
	}
	return l.buf.Bytes(), l.err
}
