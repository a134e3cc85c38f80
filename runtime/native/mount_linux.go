package native

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
)

// skelKind is what a skeleton entry of the root template is.
type skelKind uint8

const (
	skelDir     skelKind = iota // a directory (a mount point)
	skelFile                    // a file with content (or an empty mount point)
	skelSymlink                 // a symlink
	skelCopy                    // a copy of the host entry of the same path
)

// skelEntry is one directory, file, symlink or host copy of a root template.
type skelEntry struct {
	kind   skelKind
	path   string
	data   []byte
	target string
	mode   os.FileMode
}

// treeBuilder accumulates the sandbox root: a skeleton (directories, mount
// points, synthesized files) that the parent materializes once per layout
// as a template directory, and the mounts the child performs on top of it.
type treeBuilder struct {
	root    string // the template directory, bound onto itself as the new root
	skel    []skelEntry
	ops     []op
	opPaths []string // sandbox path each op mounts on, resolved under root at the end
	steps   []string // human description per op, for setup errors
	dirs    map[string]bool
	tmpfs   map[string]bool // sandbox paths where the child mounts a fresh tmpfs
	made    map[string]bool // mount points the child creates inside those
	remount []op
	rsteps  []string
	// homeBind is /home/<user> when it is a mount point for a second
	// mount of /workspace (bound after pivot_root), not a link.
	homeBind string
}

func cstr(s string) *byte {
	p, err := syscall.BytePtrFromString(s)
	if err != nil {
		panic(fmt.Sprintf("airlock: path with NUL byte %q", s)) // policy.Validate refuses these
	}
	return p
}

// add appends a mount step on sandbox path at.
func (t *treeBuilder) add(o op, at, step string) {
	t.ops = append(t.ops, o)
	t.opPaths = append(t.opPaths, at)
	t.steps = append(t.steps, step)
}

// mkdirAll adds mkdir steps for p (a sandbox path) and its parents.
func (t *treeBuilder) mkdirAll(p string) {
	if p == "/" || t.dirs[p] {
		return
	}
	t.mkdirAll(path.Dir(p))
	t.dirs[p] = true
	t.skel = append(t.skel, skelEntry{kind: skelDir, path: p, mode: 0o755})
}

func (t *treeBuilder) file(p string, data []byte, mode os.FileMode) {
	t.mkdirAll(path.Dir(p))
	t.skel = append(t.skel, skelEntry{kind: skelFile, path: p, data: data, mode: mode})
}

func (t *treeBuilder) symlink(target, p string) {
	t.mkdirAll(path.Dir(p))
	t.skel = append(t.skel, skelEntry{kind: skelSymlink, path: p, target: target})
}

func (t *treeBuilder) mount(src, dst, fstype string, flags uintptr, data string) {
	o := op{flags: flags}
	if src != "" {
		o.src = cstr(src)
	}
	if fstype != "" {
		o.fstype = cstr(fstype)
	}
	if data != "" {
		o.data = cstr(data)
	}
	t.add(o, dst, "mount "+fstype+" "+dst)
}

// lockedFlags returns the mount flags of the host mount holding p that a
// user namespace may not clear on a bind remount.
func lockedFlags(p string) uintptr {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return 0
	}
	var f uintptr
	for _, m := range []struct{ st, ms int64 }{
		{unix.ST_RDONLY, unix.MS_RDONLY}, {unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV},
		{unix.ST_NOEXEC, unix.MS_NOEXEC}, {unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if st.Flags&m.st != 0 {
			f |= uintptr(m.ms)
		}
	}
	return f
}

// tmpfsMount adds a fresh tmpfs at sandbox path dst; mount points below it
// are then made by the child (bindUnderTmpfs).
func (t *treeBuilder) tmpfsMount(dst string, flags uintptr, data string) {
	t.mkdirAll(dst)
	t.mount("tmpfs", dst, "tmpfs", flags, data)
	t.tmpfs[dst] = true
}

// underTmpfs returns the tmpfs the child mounts (/workspace, /tmp) that
// holds sandbox path dst, or "".
func (t *treeBuilder) underTmpfs(dst string) string {
	for fs := path.Dir(dst); fs != "/" && fs != "."; fs = path.Dir(fs) {
		if t.tmpfs[fs] {
			return fs
		}
	}
	return ""
}

// bindUnderTmpfs binds host src at dst inside tmpfs fs. The template cannot
// hold a mount point inside a tmpfs, so src is bound (and remounted with
// its flags) at a staging point of the template, /.airlock-mnt/N, and after
// pivot_root the child creates dst and its parents in the tmpfs and moves
// the mount there. The tmpfs is fresh and empty, so no component of dst
// can be a symlink planted by the sandbox.
func (t *treeBuilder) bindUnderTmpfs(src, dst, fs string, writable bool) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	stage := fmt.Sprintf("/.airlock-mnt/%d", len(t.made))
	if err := t.bind(src, stage, writable, false); err != nil {
		return err
	}
	var parents []string
	for p := path.Dir(dst); p != fs; p = path.Dir(p) {
		parents = append(parents, p)
	}
	for i := len(parents) - 1; i >= 0; i-- {
		t.mknod(parents[i], syscall.S_IFDIR|0o755)
	}
	if fi.IsDir() {
		t.mknod(dst, syscall.S_IFDIR|0o755)
	} else {
		t.mknod(dst, syscall.S_IFREG|0o644)
	}
	t.remount = append(t.remount, op{src: cstr(stage), path: cstr(dst), flags: unix.MS_MOVE})
	t.rsteps = append(t.rsteps, "move "+src+" to "+dst)
	return nil
}

// mknod adds, after pivot_root, the creation of mount point p.
func (t *treeBuilder) mknod(p string, mode uint32) {
	if t.made[p] {
		return
	}
	t.made[p] = true
	t.remount = append(t.remount, op{path: cstr(p), mknod: mode})
	t.rsteps = append(t.rsteps, "create mount point "+p)
}

// bind adds a bind of host src at sandbox dst, then a remount that makes it
// nosuid (and nodev unless dev), read-only unless writable.
func (t *treeBuilder) bind(src, dst string, writable, dev bool) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		t.mkdirAll(dst)
	} else {
		t.file(dst, nil, 0o644)
	}
	t.add(op{src: cstr(src), flags: unix.MS_BIND | unix.MS_REC}, dst, "bind "+src+" at "+dst)
	want := uintptr(unix.MS_NOSUID)
	if !dev {
		want |= unix.MS_NODEV
	} else {
		want |= unix.MS_NOEXEC
	}
	if !writable {
		want |= unix.MS_RDONLY
	}
	have := lockedFlags(src)
	if have&want == want {
		return nil // the bind inherits the source mount's flags: nothing to tighten
	}
	t.add(op{flags: unix.MS_BIND | unix.MS_REMOUNT | want | have}, dst, "remount "+dst)
	return nil
}

// maxEtcCopy bounds what a template copies from the host's /etc.
const maxEtcCopy = 16 << 20

// copyEtc adds a host /etc entry (file, symlink or directory tree) to the
// template, so it costs no mount per sandbox. Nothing is read now: the
// template's name covers a cheap signature of the entry (see hostSig) and
// the copy happens only when that template does not exist yet.
func (t *treeBuilder) copyEtc(p string) {
	if _, err := os.Lstat(p); err != nil {
		return // optional
	}
	t.mkdirAll(path.Dir(p))
	t.skel = append(t.skel, skelEntry{kind: skelCopy, path: p})
}

// hostSig writes a signature of host entry p: its own metadata and, for a
// directory, that of every directory below it. Package managers replace
// files by rename, which changes the directory's mtime, so the signature
// changes whenever the tree does, without reading or stat-ing every file.
func hostSig(w io.Writer, p string) {
	fi, err := os.Lstat(p)
	if err != nil {
		fmt.Fprintf(w, "%s missing\n", p)
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	fmt.Fprintf(w, "%s %o %d %d %d %d\n", p, fi.Mode(), fi.Size(), st.Ino, st.Mtim.Nano(), st.Ctim.Nano())
	if !fi.IsDir() {
		return
	}
	ents, _ := os.ReadDir(p)
	for _, e := range ents {
		if e.IsDir() {
			hostSig(w, path.Join(p, e.Name()))
		}
	}
}

// copyHost copies host entry src to dst (a new path), recursively,
// keeping symlinks as symlinks and leaving out what cannot be read.
func copyHost(src, dst string, budget *int64) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return nil
	}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case fi.IsDir():
		if err := os.Mkdir(dst, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := copyHost(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), budget); err != nil {
				return err
			}
		}
	case fi.Mode().IsRegular():
		if *budget -= fi.Size(); *budget < 0 {
			return fmt.Errorf("host files under /etc to copy exceed %d bytes", maxEtcCopy)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil // unreadable host file: leave it out
		}
		return os.WriteFile(dst, data, 0o644)
	}
	return nil
}

// sandboxFiles are the synthesized /etc files.
func etcFiles(p *policy.Policy) map[string]string {
	u := p.User
	return map[string]string{
		"/etc/passwd": fmt.Sprintf("root:x:0:0:root:/root:/usr/sbin/nologin\n%s:x:%d:%d:%s:%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
			u.Name, u.UID, u.GID, u.Name, u.Home),
		"/etc/group":       fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", u.Name, u.GID),
		"/etc/hosts":       fmt.Sprintf("127.0.0.1\tlocalhost %s\n::1\tlocalhost ip6-localhost\n", u.Hostname),
		"/etc/hostname":    u.Hostname + "\n",
		"/etc/resolv.conf": "# airlock: no DNS inside the sandbox; allowed egress goes through the proxy in HTTP_PROXY\n",
	}
}

// buildTree computes every mount step of the sandbox root for policy p.
// homeLink makes /home/<user> a symbolic link to /workspace instead of a
// second mount of it (for a Layout: see below).
func buildTree(base string, p *policy.Policy, cfg *Config, homeLink bool) (*treeBuilder, error) {
	t := &treeBuilder{dirs: map[string]bool{}, tmpfs: map[string]bool{}, made: map[string]bool{}}
	fs := &p.Filesystem

	for _, ro := range fs.ReadOnly {
		fi, err := os.Lstat(ro)
		if err != nil {
			continue // a host may lack /lib64 or /lib32
		}
		if fi.Mode()&os.ModeSymlink != 0 { // merged /usr: /bin -> usr/bin
			target, err := os.Readlink(ro)
			if err != nil {
				return nil, fmt.Errorf("read link %s: %w", ro, err)
			}
			t.symlink(target, ro)
			continue
		}
		if err := t.bind(ro, ro, false, false); err != nil {
			return nil, fmt.Errorf("bind %s: %w", ro, err)
		}
	}

	// E2B-style home: /home/<user> is the workspace too. In a root this
	// runtime mounts, it is a second mount of the workspace (bound after
	// pivot_root, below), so that a process working there is in
	// /home/<user> by getcwd(2), as E2B code expects; the same files,
	// disk cap and Landlock rules (which hold on the inodes). An OCI
	// runtime cannot bind one of the sandbox's own mounts elsewhere: a
	// Layout leaves the bind to its caller (Layout.HomeBind) or has a
	// symbolic link (homeLink).
	home := ""
	if p.User.Name != "" && !strings.ContainsAny(p.User.Name, "/\x00") && p.User.Name != "." && p.User.Name != ".." {
		home = "/home/" + p.User.Name
		if homeLink {
			t.symlink("/workspace", home)
		} else {
			t.mkdirAll(home)
		}
	}
	// `python` as E2B's images have it, for hosts whose /usr has only
	// python3: a link in a directory of the root template, last on the
	// default PATH (a host's own python comes first).
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		t.symlink("/usr/bin/python3", policy.AliasDir+"/python")
	}
	t.mkdirAll("/etc")
	etc := etcFiles(p)
	for _, name := range []string{"/etc/passwd", "/etc/group", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"} {
		t.file(name, []byte(etc[name]), 0o644)
	}
	for _, f := range fs.EtcFiles {
		t.copyEtc(f)
	}

	// /dev: the harmless devices bound from the host and a private devpts
	// instance; no host terminal is reachable.
	t.mkdirAll("/dev")
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := t.bind("/dev/"+d, "/dev/"+d, true, true); err != nil {
			return nil, fmt.Errorf("bind /dev/%s: %w", d, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"} {
		t.symlink(target, "/dev/"+name)
	}
	t.mkdirAll("/dev/pts")
	t.mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
	t.mkdirAll("/dev/shm")
	t.mount("tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		fmt.Sprintf("mode=1777,size=%d,nr_inodes=%d", min(p.Limits.DiskBytes, 64<<20), min(p.Limits.Inodes, 4096)))

	t.mkdirAll("/proc")
	t.mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	t.maskProc()

	t.tmpfsMount("/tmp", unix.MS_NOSUID|unix.MS_NODEV,
		fmt.Sprintf("mode=1777,size=%d,nr_inodes=%d", p.Limits.DiskBytes, p.Limits.Inodes))

	if fs.Workspace != "" {
		if err := t.bind(fs.Workspace, "/workspace", true, false); err != nil {
			return nil, fmt.Errorf("workspace %s: %w", fs.Workspace, err)
		}
	} else {
		t.tmpfsMount("/workspace", unix.MS_NOSUID|unix.MS_NODEV,
			fmt.Sprintf("mode=0755,size=%d,nr_inodes=%d,uid=%d,gid=%d", p.Limits.DiskBytes, p.Limits.Inodes, p.User.UID, p.User.GID))
	}

	for _, m := range fs.Mounts {
		src, err := filepath.EvalSymlinks(m.Source)
		if err != nil {
			return nil, fmt.Errorf("mount source %s: %w", m.Source, err)
		}
		if fs := t.underTmpfs(m.Target); fs != "" {
			err = t.bindUnderTmpfs(src, m.Target, fs, m.Writable)
		} else {
			err = t.bind(src, m.Target, m.Writable, false)
		}
		if err != nil {
			return nil, fmt.Errorf("mount %s: %w", m.Source, err)
		}
	}
	if home != "" && !homeLink {
		// After the workspace and the mounts into it; a bind keeps the
		// source mounts' flags (nosuid, nodev, and those locked).
		t.remount = append(t.remount, op{src: cstr("/workspace"), path: cstr(home), flags: unix.MS_BIND | unix.MS_REC})
		t.rsteps = append(t.rsteps, "bind /workspace at "+home)
		t.homeBind = home
	}
	if cfg.AgentBinary != "" {
		if err := t.bind(cfg.AgentBinary, AgentPath, false, false); err != nil {
			return nil, fmt.Errorf("agent binary %s: %w", cfg.AgentBinary, err)
		}
	}
	for _, h := range fs.Hidden {
		// Whatever is at h is covered: a directory by an empty read-only
		// tmpfs, anything else by /dev/null. Hidden paths live under the
		// read-only binds, which sit at their host paths; missing ones are
		// skipped.
		fi, err := os.Stat(h)
		switch {
		case err != nil:
			continue
		case fi.IsDir():
			t.add(op{src: cstr("tmpfs"), fstype: cstr("tmpfs"),
				flags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, data: cstr("size=4k,nr_inodes=4")}, h, "hide "+h)
		default:
			t.add(op{src: cstr("/dev/null"), flags: unix.MS_BIND}, h, "hide "+h)
		}
	}

	// The template becomes the root: bound onto itself (pivot_root needs a
	// mount point) first, read-only after pivot_root.
	tmpl, err := materialize(base, t.skel)
	if err != nil {
		return nil, err
	}
	t.root = tmpl
	for i := range t.ops {
		t.ops[i].path = cstr(tmpl + t.opPaths[i])
	}
	t.ops = append([]op{{src: cstr(tmpl), path: cstr(tmpl), flags: unix.MS_BIND | unix.MS_REC}}, t.ops...)
	t.steps = append([]string{"bind root template"}, t.steps...)
	t.remount = append(t.remount,
		op{path: cstr("/"), flags: unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | lockedFlags(tmpl)})
	t.rsteps = append(t.rsteps, "remount / read-only")
	return t, nil
}

// materialize creates (once) the template directory holding skel under base
// and returns its path. Templates are named by a hash of their content, so
// concurrent launchers agree and a changed layout gets a new directory.
func materialize(base string, skel []skelEntry) (string, error) {
	h := sha256.New()
	for _, e := range skel {
		fmt.Fprintf(h, "%d\x00%s\x00%s\x00%o\x00%d\x00", e.kind, e.path, e.target, e.mode, len(e.data))
		h.Write(e.data)
		if e.kind == skelCopy {
			hostSig(h, e.path)
		}
	}
	dir := filepath.Join(base, "root-"+hex.EncodeToString(h.Sum(nil))[:24])
	templates.Lock()
	defer templates.Unlock()
	if templates.ready[dir] {
		return dir, nil
	}
	marker := filepath.Join(dir, ".airlock-template")
	if _, err := os.Stat(marker); err == nil {
		now := time.Now()
		_ = os.Chtimes(marker, now, now) // in use: keep it from the sweep below
		templates.ready[dir] = true
		return dir, nil
	}
	sweepTemplates(base)
	tmp, err := os.MkdirTemp(base, ".tmp-root-")
	if err != nil {
		return "", fmt.Errorf("create root template: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	budget := int64(maxEtcCopy)
	for _, e := range skel {
		p := filepath.Join(tmp, e.path)
		switch e.kind {
		case skelCopy:
			err = copyHost(e.path, p, &budget)
		case skelDir:
			err = os.Mkdir(p, e.mode)
		case skelFile:
			err = os.WriteFile(p, e.data, e.mode)
		case skelSymlink:
			err = os.Symlink(e.target, p)
		}
		if err != nil && !os.IsExist(err) {
			return "", fmt.Errorf("root template %s: %w", e.path, err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, ".airlock-template"), nil, 0o444); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil && !os.IsExist(err) && !errors.Is(err, syscall.ENOTEMPTY) {
		return "", fmt.Errorf("install root template: %w", err)
	}
	templates.ready[dir] = true
	return dir, nil
}

// templateMaxIdle is how long a template may go unused before a launcher
// building a new one removes it. Sandboxes live at most a day (the server's
// largest TTL), so a template idle this long is mounted nowhere.
const templateMaxIdle = 7 * 24 * time.Hour

// sweepTemplates removes templates no launcher has used for templateMaxIdle.
func sweepTemplates(base string) {
	ents, _ := os.ReadDir(base)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "root-") && !strings.HasPrefix(e.Name(), ".tmp-root-") {
			continue
		}
		fi, err := os.Stat(filepath.Join(base, e.Name(), ".airlock-template"))
		if err != nil {
			if dfi, derr := e.Info(); derr == nil && time.Since(dfi.ModTime()) > time.Hour {
				os.RemoveAll(filepath.Join(base, e.Name())) // a half-built leftover
			}
			continue
		}
		if time.Since(fi.ModTime()) > templateMaxIdle {
			os.RemoveAll(filepath.Join(base, e.Name()))
		}
	}
}

var templates = struct {
	sync.Mutex
	ready map[string]bool
}{ready: map[string]bool{}}

// treeCache holds built trees by the inputs they depend on, so a repeated
// policy costs a few stat calls instead of a rebuild.
var treeCache = struct {
	sync.Mutex
	m map[string]*treeBuilder
}{m: map[string]*treeBuilder{}}

// cachedTree returns the tree for p, building it on first use. The key
// covers the filesystem policy, the tmpfs sizes, the user, the agent binary
// and the size and mtime of every host file the tree copies or binds.
func cachedTree(base string, p *policy.Policy, cfg *Config, homeLink bool) (*treeBuilder, error) {
	h := sha256.New()
	enc := json.NewEncoder(h)
	_ = enc.Encode([]any{p.Filesystem, p.Limits.DiskBytes, p.Limits.Inodes, p.User, cfg.AgentBinary, homeLink})
	for _, f := range append(append([]string{}, p.Filesystem.EtcFiles...), p.Filesystem.Hidden...) {
		if fi, err := os.Lstat(f); err == nil {
			fmt.Fprintf(h, "%s %d %d\n", f, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	key := string(h.Sum(nil))
	treeCache.Lock()
	t, ok := treeCache.m[key]
	treeCache.Unlock()
	if ok {
		if _, err := os.Stat(t.root); err == nil {
			return t, nil
		}
	}
	t, err := buildTree(base, p, cfg, homeLink)
	if err != nil {
		return nil, err
	}
	treeCache.Lock()
	if len(treeCache.m) > 256 {
		clear(treeCache.m)
	}
	treeCache.m[key] = t
	treeCache.Unlock()
	return t, nil
}
