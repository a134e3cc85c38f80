package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configures DetectPeers.
type Options struct {
	// Runsc is the path of gVisor's runsc; empty means look it up on PATH.
	Runsc string
	// Srt is the path of sandbox-runtime's srt; empty means look it up on
	// PATH.
	Srt string
	// ScratchDir is where bundles and runtime state are created (each peer
	// makes its own directory in Prepare and removes it in Cleanup); empty
	// means os.TempDir().
	ScratchDir string
	// Timeout bounds one run of a peer; zero means one minute.
	Timeout time.Duration
}

// peerOrder is the order in which DetectPeers returns peers.
var peerOrder = []string{"bare", "unshare", "bwrap", "crun", "runc", "runsc", "srt"}

// PeerNames returns the names of the peers DetectPeers knows, in order.
func PeerNames() []string { return append([]string(nil), peerOrder...) }

// DetectPeers returns the peers available on this machine, and the missing
// ones with the reason they are missing, in the order bare, unshare, bwrap,
// crun, runc, runsc, srt. It only looks the programs up; a peer that is
// installed but cannot run here fails in its Prepare or warm-up run, and
// Alternate reports that error.
func DetectPeers(opts Options) []Peer {
	if opts.Timeout <= 0 {
		opts.Timeout = time.Minute
	}
	if opts.ScratchDir == "" {
		opts.ScratchDir = os.TempDir()
	}
	d := detector{opts: opts, root: os.Geteuid() == 0}
	return []Peer{
		d.bare(), d.unshare(), d.bwrap(), d.crun(), d.runc(), d.runsc(), d.srt(),
	}
}

// detector builds the peers.
type detector struct {
	opts Options
	root bool
}

// look finds a program on PATH, or returns a Missing reason.
func look(name string) (string, string) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", name + " not found on PATH"
	}
	return p, ""
}

// run runs name args to completion with stdin and stdout on /dev/null and
// stderr captured for the error message.
func (d *detector) run(name string, args ...string) error {
	return runWith(d.opts.Timeout, runSpec{}, name, args...)
}

// runSpec adjusts how runWith starts a command.
type runSpec struct {
	dir string   // working directory; empty: the current one
	env []string // extra environment entries
	// start, if set, starts the command; it lets the crun peer start its
	// process from a thread in a private mount namespace.
	start func(*exec.Cmd) error
	// stderrFile sends stderr to a temporary file instead of a pipe, for
	// commands that leave a detached child holding their stderr (an OCI
	// runtime's `run --detach`): with a pipe, Wait would wait for it.
	stderrFile bool
}

// runWith is run with the adjustments of spec.
func runWith(timeout time.Duration, spec runSpec, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = spec.dir
	if spec.env != nil {
		cmd.Env = append(os.Environ(), spec.env...)
	}
	var stderr bytes.Buffer
	var errFile *os.File
	if spec.stderrFile {
		f, err := os.CreateTemp("", "bench-stderr-")
		if err != nil {
			return err
		}
		os.Remove(f.Name())
		defer f.Close()
		cmd.Stderr, errFile = f, f
	} else {
		cmd.Stderr = &stderr
	}
	cmd.WaitDelay = time.Second
	var err error
	if spec.start != nil {
		err = spec.start(cmd)
	} else {
		err = cmd.Start()
	}
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		if errFile != nil {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", errFile.Fd()))
			stderr.Write(b)
		}
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 300 {
			msg = "..." + msg[len(msg)-300:]
		}
		if msg != "" {
			return fmt.Errorf("%s: %w: %s", name, err, msg)
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// bare runs the command directly: the floor every sandbox is compared to.
func (d *detector) bare() Peer {
	return Peer{
		Name: "bare",
		Note: "fork+exec+wait, no sandbox",
		Run: func(argv []string) error {
			if len(argv) == 0 {
				return errors.New("empty command")
			}
			return d.run(argv[0], argv[1:]...)
		},
		StartIdle: func(argv []string) (*Idle, error) {
			return startIdleProcess(runSpec{}, argv[0], argv[1:]...)
		},
	}
}

// unshareFlags are the unshare(1) options: every namespace, root mapped.
var unshareFlags = []string{"--user", "--map-root-user", "--pid", "--fork", "--mount", "--net", "--ipc", "--uts", "--cgroup"}

// unshare runs the command in new namespaces of every kind, without
// changing the filesystem view.
func (d *detector) unshare() Peer {
	p := Peer{Name: "unshare"}
	path, missing := look("unshare")
	if missing != "" {
		p.Missing = missing
		return p
	}
	p.Note = "unshare " + strings.Join(unshareFlags, " ") + " -- CMD (host filesystem, no pivot_root)"
	p.Run = func(argv []string) error {
		return d.run(path, append(append(append([]string{}, unshareFlags...), "--"), argv...)...)
	}
	p.StartIdle = func(argv []string) (*Idle, error) {
		return startIdleProcess(runSpec{}, path, append(append(append([]string{}, unshareFlags...), "--"), argv...)...)
	}
	return p
}

// bwrap runs the command under bubblewrap with every namespace unshared and
// a read-only /usr root.
func (d *detector) bwrap() Peer {
	p := Peer{Name: "bwrap"}
	path, missing := look("bwrap")
	if missing != "" {
		p.Missing = missing
		return p
	}
	p.Note = "bwrap " + strings.Join(bwrapArgs([]string{"CMD"}), " ")
	p.Run = func(argv []string) error { return d.run(path, bwrapArgs(argv)...) }
	p.StartIdle = func(argv []string) (*Idle, error) {
		return startIdleProcess(runSpec{}, path, bwrapArgs(argv)...)
	}
	return p
}

// ociPeer holds what the crun, runc and runsc peers share: a bundle created
// in Prepare and removed in Cleanup, and a counter for container names.
type ociPeer struct {
	d    *detector
	name string
	b    *bundle
	mu   sync.Mutex // guards n: startIdle runs concurrently
	n    int
}

func (o *ociPeer) prepare() error {
	b, err := newBundle(o.d.opts.ScratchDir, !o.d.root)
	if err != nil {
		return err
	}
	o.b = b
	return nil
}

func (o *ociPeer) cleanup() {
	o.b.remove()
	o.b = nil
	if o.d.root {
		removeCgroups(o.name)
		// The parent of the detached containers' cgroups, once empty.
		removeDensityCgroups()
	}
}

// next writes argv into the bundle and returns a fresh container id.
func (o *ociPeer) next(argv []string) (string, error) {
	if o.b == nil {
		return "", errors.New("bundle not prepared")
	}
	if err := o.b.setArgs(argv); err != nil {
		return "", err
	}
	o.n++
	return containerID(o.name, o.n), nil
}

// startIdle starts argv detached (`RUNTIME --root STATE run --detach`) in a
// container of its own whose cgroup, when running as root, is
// DensityCgroupParent/ID, so the density figure finds all its processes
// and its kernel memory there. start runs the runtime (crun needs its
// namespace thread); the container is removed with `delete --force`.
func (o *ociPeer) startIdle(path string, start func(*exec.Cmd) error, globals, argv []string) (*Idle, error) {
	if o.b == nil {
		return nil, errors.New("bundle not prepared")
	}
	o.mu.Lock()
	o.n++
	id := containerID(o.name, o.n)
	o.mu.Unlock()
	cgPath := ""
	if o.d.root {
		cgPath = "/" + densityCgroupParent() + "/" + id
	}
	dir, err := o.b.containerBundle(id, argv, cgPath)
	if err != nil {
		return nil, err
	}
	pidFile := filepath.Join(dir, "pid")
	spec := runSpec{start: start, stderrFile: true}
	args := append(append([]string{}, globals...), "run", "--detach", "--pid-file", pidFile, "--bundle", dir, id)
	del := func() error {
		err := runWith(o.d.opts.Timeout, runSpec{start: start}, path, append(append([]string{}, globals...), "delete", "--force", id)...)
		os.RemoveAll(dir)
		return err
	}
	if err := runWith(o.d.opts.Timeout, spec, path, args...); err != nil {
		del()
		return nil, err
	}
	b, err := os.ReadFile(pidFile)
	pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || perr != nil || pid <= 0 {
		del()
		return nil, fmt.Errorf("%s: no container pid in %s: %v", o.name, pidFile, errors.Join(err, perr))
	}
	cg := memCgroup(pid)
	stop := func() error {
		err := del()
		if err != nil && cg != "" && cg != memCgroup(os.Getpid()) {
			// Leave nothing running: kill what is left in its cgroup.
			for _, p := range cgroupProcs(cg) {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		return err
	}
	exec := func(cmd []string) error {
		return runWith(o.d.opts.Timeout, runSpec{start: start}, path, append(append(append([]string{}, globals...), "exec", id), cmd...)...)
	}
	return &Idle{Root: pid, Stop: stop, Exec: exec}, nil
}

// runc runs the command as `runc run` of an OCI bundle.
func (d *detector) runc() Peer {
	p := Peer{Name: "runc"}
	path, missing := look("runc")
	if missing != "" {
		p.Missing = missing
		return p
	}
	o := &ociPeer{d: d, name: "runc"}
	p.Note = "runc --root STATE run --bundle B ID; " + bundleNote(!d.root)
	p.Prepare, p.Cleanup = o.prepare, o.cleanup
	p.Run = func(argv []string) error {
		id, err := o.next(argv)
		if err != nil {
			return err
		}
		return d.run(path, "--root", o.b.stateDir("runc"), "run", "--bundle", o.b.dir, id)
	}
	p.StartIdle = func(argv []string) (*Idle, error) {
		return o.startIdle(path, nil, []string{"--root", o.b.stateDir("runc")}, argv)
	}
	p.IdleNote = "runc --root STATE run --detach --pid-file F --bundle B ID; " + idleBundleNote(d.root)
	p.CanExec, p.ExecNote = true, "runc --root STATE exec ID CMD in a container started with run --detach"
	return p
}

// idleBundleNote describes the bundle of the container peers' idle
// sandboxes.
func idleBundleNote(root bool) string {
	s := "the same bundle, detached (the runtime exits; no monitor process)"
	if root {
		s += ", in cgroup " + densityCgroupParent() + "/ID"
	}
	return s
}

// bundleNote describes the OCI bundle the container peers run.
func bundleNote(rootless bool) string {
	s := "bundle: read-only empty root + ro bind /usr, merged-usr symlinks, proc, tmpfs /dev and /tmp, ns pid,mount,ipc,uts,net,cgroup"
	if rootless {
		s += ",user (rootless)"
	} else {
		s += " (as root)"
	}
	return s
}

// crun runs the command as `crun run` of an OCI bundle. crun 1.8 refuses a
// hybrid cgroup layout (v1 controllers plus a cgroup2 mount at
// /sys/fs/cgroup/unified that has controllers): on such a host crun is
// started from a thread in a private mount namespace where a tmpfs hides
// /sys/fs/cgroup/unified, so crun sees a pure v1 layout and uses its
// cgroupfs manager.
func (d *detector) crun() Peer {
	p := Peer{Name: "crun"}
	path, missing := look("crun")
	if missing != "" {
		p.Missing = missing
		return p
	}
	hybrid := hybridCgroups()
	if hybrid && !d.root {
		p.Missing = "crun 1.8 refuses hybrid cgroups and hiding /sys/fs/cgroup/unified needs root"
		return p
	}
	o := &ociPeer{d: d, name: "crun"}
	p.Note = "crun --root STATE run --bundle B ID; " + bundleNote(!d.root)
	var ns *nsThread
	if hybrid {
		p.Note = "crun started from a thread in a private mount namespace with a tmpfs over /sys/fs/cgroup/unified (hybrid cgroups; cgroupfs v1 manager); " + p.Note
	}
	p.Prepare = func() error {
		if err := o.prepare(); err != nil {
			return err
		}
		if hybrid {
			t, err := newNSThread("/sys/fs/cgroup/unified")
			if err != nil {
				o.cleanup()
				return err
			}
			ns = t
		}
		return nil
	}
	p.Cleanup = func() {
		if ns != nil {
			ns.close()
			ns = nil
		}
		o.cleanup()
	}
	p.Run = func(argv []string) error {
		id, err := o.next(argv)
		if err != nil {
			return err
		}
		var spec runSpec
		if ns != nil {
			spec.start = ns.start
		}
		return runWith(d.opts.Timeout, spec, path, "--root", o.b.stateDir("crun"), "run", "--bundle", o.b.dir, id)
	}
	p.StartIdle = func(argv []string) (*Idle, error) {
		var start func(*exec.Cmd) error
		if ns != nil {
			start = ns.start
		}
		return o.startIdle(path, start, []string{"--root", o.b.stateDir("crun")}, argv)
	}
	p.IdleNote = "crun --root STATE run --detach --pid-file F --bundle B ID; " + idleBundleNote(d.root)
	p.CanExec, p.ExecNote = true, "crun --root STATE exec ID CMD in a container started with run --detach"
	if hybrid {
		p.IdleNote = "crun started from a thread in a private mount namespace with a tmpfs over /sys/fs/cgroup/unified; " + p.IdleNote
	}
	return p
}

// runscFlags are the global runsc flags used for every run.
func (d *detector) runscFlags(state string) []string {
	f := []string{"--root", state, "--network=none"}
	if !d.root {
		f = append(f, "--rootless")
	}
	return f
}

// runsc runs the command under gVisor with the default platform and no
// network. As root it is `runsc run` of the same OCI bundle as crun and runc.
// Rootless `runsc run` cannot start its gofer here (fork/exec of
// /proc/self/exe is not permitted), so without root it is
// `runsc --rootless do`, which runs the command over the host's root
// filesystem instead of the bundle.
func (d *detector) runsc() Peer {
	p := Peer{Name: "runsc"}
	path := d.opts.Runsc
	if path == "" {
		var missing string
		path, missing = look("runsc")
		if missing != "" {
			p.Missing = missing + " (build it with scripts/bench-peers.sh, or pass its path)"
			return p
		}
	} else if _, err := os.Stat(path); err != nil {
		p.Missing = "runsc: " + err.Error()
		return p
	}
	o := &ociPeer{d: d, name: "runsc"}
	p.Prepare, p.Cleanup = o.prepare, o.cleanup
	if !d.root {
		p.Note = "runsc " + strings.Join(d.runscFlags("STATE"), " ") + " do CMD (rootless: host root filesystem, not the bundle)"
		p.Run = func(argv []string) error {
			if _, err := o.next(argv); err != nil {
				return err
			}
			args := append(d.runscFlags(o.b.stateDir("runsc")), "do")
			return d.run(path, append(args, argv...)...)
		}
		p.IdleMissing = "rootless runsc runs `do`, not a detached container"
		return p
	}
	p.Note = "runsc " + strings.Join(d.runscFlags("STATE"), " ") + " run --bundle B ID; " + bundleNote(false)
	p.Run = func(argv []string) error {
		id, err := o.next(argv)
		if err != nil {
			return err
		}
		args := append(d.runscFlags(o.b.stateDir("runsc")), "run", "--bundle", o.b.dir, id)
		return d.run(path, args...)
	}
	p.StartIdle = func(argv []string) (*Idle, error) {
		return o.startIdle(path, nil, d.runscFlags(o.b.stateDir("runsc")), argv)
	}
	p.IdleNote = "runsc " + strings.Join(d.runscFlags("STATE"), " ") + " run --detach --pid-file F --bundle B ID; " + idleBundleNote(d.root)
	p.CanExec, p.ExecNote = true, "runsc "+strings.Join(d.runscFlags("STATE"), " ")+" exec ID CMD in a container started with run --detach"
	return p
}

// srt runs the command under Anthropic's sandbox-runtime CLI (the path
// given, or srt on PATH). srt joins
// its arguments into one bash command line without quoting, so the command
// is passed shell-quoted with -c. srt scans and exposes its working
// directory, and leaves a socket in TMPDIR on every run, so it runs with
// both set to an empty directory made in Prepare.
func (d *detector) srt() Peer {
	p := Peer{Name: "srt"}
	path := d.opts.Srt
	if path == "" {
		var missing string
		path, missing = look("srt")
		if missing != "" {
			p.Missing = missing + " (install @anthropic-ai/sandbox-runtime with npm, or pass its path)"
			return p
		}
	} else if _, err := os.Stat(path); err != nil {
		p.Missing = "srt: " + err.Error()
		return p
	}
	var dir string
	p.Note = "srt -c 'CMD' with cwd and TMPDIR an empty directory, default settings (bwrap + seccomp + its HTTP/SOCKS proxies)"
	p.Prepare = func() error {
		var err error
		dir, err = os.MkdirTemp(d.opts.ScratchDir, "srt-")
		return err
	}
	p.Cleanup = func() {
		if dir != "" {
			os.RemoveAll(dir)
			dir = ""
		}
	}
	p.Run = func(argv []string) error {
		spec := runSpec{dir: dir, env: []string{"TMPDIR=" + dir}}
		return runWith(d.opts.Timeout, spec, path, "-c", shellJoin(argv))
	}
	p.StartIdle = func(argv []string) (*Idle, error) {
		spec := runSpec{dir: dir, env: []string{"TMPDIR=" + dir}}
		return startIdleProcess(spec, path, "-c", shellJoin(argv))
	}
	return p
}

// shellJoin quotes argv for a POSIX shell.
func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) < 0 {
			q[i] = a
			continue
		}
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// once-computed host facts.
var hybridOnce = sync.OnceValue(detectHybrid)

// hybridCgroups reports whether the host mounts cgroup v1 controllers and a
// cgroup2 hierarchy with controllers at /sys/fs/cgroup/unified.
func hybridCgroups() bool { return hybridOnce() }
