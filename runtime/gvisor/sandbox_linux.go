package gvisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/launcher"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// StateBase holds runsc's state directory (root/: runsc's --root, shared
// by all of airlock's gVisor sandboxes, so that runsc's empty network
// namespace is made once) and one private bundle directory per sandbox
// (bundles/ID), removed by Destroy.
const StateBase = "/run/airlock/runsc"

// runscRoot is runsc's --root.
var runscRoot = filepath.Join(StateBase, "root")

// ErrNetworkAdopt is returned by Adopt for a paused sandbox with network
// when no proxy listener addresses are given to open in a new egress
// namespace: the one its restore joined was held by the process that
// paused it, and went with that process.
var ErrNetworkAdopt = errors.New("a paused gvisor sandbox with network needs a new egress namespace with the proxy's listeners to be adopted (the one it had was held by the server that paused it)")

// Platform is the gVisor platform airlock uses: systrap works without
// /dev/kvm and inside VMs.
const Platform = "systrap"

// Sandbox is a started gVisor sandbox: `runsc run` and, under it, gVisor's
// sentry (the user-space kernel the program runs on) and gofer (its file
// server), both in the sandbox's cgroup.
type Sandbox struct {
	// ID names the sandbox (its cgroup, its runsc container id).
	ID string
	// Pid is the host pid of the `runsc run` process.
	Pid int
	// Started is when runsc was started.
	Started time.Time

	runsc         Runsc
	surviveParent bool
	dir           string // private state directory: bundle/
	cmd           *exec.Cmd
	group         *cgroups.Group
	enforced      rt.Enforced

	netns     *os.File             // the namespace runsc joins, while this process made it
	nsPath    string               // where it is pinned (netnsPath), "" for --network=none
	img       *native.MountedImage // an image root, mounted on the host while the sandbox lives
	upper     string               // its upper directory on the host (snapshotted with the memory)
	listeners []net.Listener       // the proxy's listeners in it, handed to the caller
	token     []byte               // the agent's reconnect token (live sandboxes)

	exited   chan struct{} // closed when an adopted runsc (not a child) exits
	waitOnce sync.Once
	state    *os.ProcessState
	waitErr  error
	waitDone chan struct{}
	destroy  sync.Once
}

// Start builds the sandbox's bundle and starts it under runsc. The
// program's own start (exec inside gVisor) happens asynchronously: a
// program that cannot be found ends the run with runsc's error on stderr
// and exit code 128 (see Run).
func Start(cfg native.Config) (*Sandbox, error) { return start(cfg, "") }

// Fork starts a new, independent sandbox from image, a Snapshot (or
// Checkpoint) of another sandbox, with `runsc restore` into a bundle of its
// own and a cgroup of its own: its processes, memory, tmpfs /workspace and
// /tmp are the snapshot's, and from then on its own. cfg must describe
// the snapshotted sandbox (same policy and program: the mount sources must
// be the same files at the same paths) except for ID and stdio, which are
// the fork's: programs inside read and write the new descriptors where
// they had the old ones.
func Fork(cfg native.Config, image string) (*Sandbox, error) {
	if image == "" {
		return nil, errors.New("gvisor: fork needs a snapshot image")
	}
	return start(cfg, image)
}

// start is Start, or Fork when image is not empty.
func start(cfg native.Config, image string) (*Sandbox, error) {
	p := cfg.Policy
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("invalid policy: %w", err)
	}
	if p.Runtime != "" && p.Runtime != policy.RuntimeGVisor {
		return nil, fmt.Errorf("gvisor: policy asks for runtime %q", p.Runtime)
	}
	if len(cfg.Args) == 0 || cfg.Args[0] == "" {
		return nil, errNoCommand
	}
	for _, s := range append(append([]string{}, cfg.Args...), p.Env...) {
		if strings.IndexByte(s, 0) >= 0 {
			return nil, errors.New("argument or environment contains a NUL byte")
		}
	}
	if (len(cfg.Listen) > 0) != (p.Network.Mode != policy.NetNone) {
		return nil, &native.SetupError{Step: "network", Err: fmt.Errorf("network mode %q with %d proxy listeners: a gvisor sandbox has either no network or the egress proxy's listeners", p.Network.Mode, len(cfg.Listen))}
	}
	rs, err := Available()
	if err != nil {
		return nil, err
	}
	id := cfg.ID
	if id == "" {
		id = native.NewID()
	}
	if !validID(id) {
		return nil, fmt.Errorf("gvisor: bad sandbox id %q: want [a-z0-9-]", id)
	}
	if p.Filesystem.Workspace != "" {
		if err := prepareWorkspace(p.Filesystem.Workspace, p.User.UID, p.User.GID); err != nil {
			return nil, err
		}
	}
	hostDirs, err := mapHostDirs(&p, id) // writable host directories of another owner: hostdir_linux.go
	if err != nil {
		return nil, err
	}
	// /home/<user> is a second mount of the workspace, as on the native
	// runtime, which the agent makes while it is privileged (below); a
	// sandbox without one has a link there instead.
	homeBind := cfg.Agent && p.User.UID != 0
	layout, img, err := rootLayout(&p, &cfg, homeBind) // image root, volumes: image_linux.go
	if err != nil {
		unstageHostDirs(id)
		return nil, err
	}
	// The agent mounts the tmpfs with their inode limit itself (runsc
	// drops nr_inodes from OCI mounts): it starts privileged and drops.
	var mounts []string
	inodes := rt.Layer{Name: "inodes", State: rt.StateDegraded, Detail: fmt.Sprintf("limits.inodes (%d) is not enforced: runsc passes only mode, size, uid and gid to gVisor's tmpfs (nr_inodes is dropped); "+
		"a flood of files is stopped by the memory limit instead, which OOM-kills the whole sandbox (about 2-3 KiB of sentry memory per empty file)", p.Limits.Inodes)}
	// The agent starts privileged (as root, with only the capabilities in
	// buildSpec) whenever it has a workload user to become: it mounts its
	// tmpfs, then takes an identity of its own (--agent-id).
	privileged := cfg.Agent && p.User.UID != 0
	if privileged && (p.User.UID == native.AgentUID || p.User.GID == native.AgentUID) {
		return nil, fmt.Errorf("gvisor: policy user %d:%d collides with the agent's uid %d", p.User.UID, p.User.GID, native.AgentUID)
	}
	if cfg.Agent {
		var capped bool
		if mounts, capped = agentTmpfs(layout); capped {
			var targets []string
			for _, a := range mounts {
				t, _, _ := strings.Cut(strings.TrimPrefix(a, "--tmpfs="), "=")
				targets = append(targets, t)
			}
			inodes = rt.Layer{Name: "inodes", State: rt.StateOK, Detail: fmt.Sprintf("tmpfs %s mounted by the agent inside gVisor with nr_inodes (%d for /workspace and /tmp; runsc drops it from OCI mounts) before it drops its privileges", strings.Join(targets, ", "), p.Limits.Inodes)}
		}
		cfg.Args = append(append([]string{}, cfg.Args...), mounts...)
		if layout.HomeBind != "" {
			cfg.Args = append(cfg.Args, "--workspace-bind="+layout.HomeBind)
		}
		if privileged {
			cfg.Args = append(cfg.Args, fmt.Sprintf("--agent-id=%d", native.AgentUID))
		}
	}
	rootArgs, err := rootAgentArgs(&p, &cfg, len(mounts) > 0) // a uid-0 workload: image_linux.go
	if err != nil {
		return nil, err
	}
	cfg.Args = append(cfg.Args, rootArgs...)
	// The workload gets a cgroup of its own inside the sentry whenever the
	// agent starts privileged and takes an identity of its own: for a
	// workload user (--agent-id) and for a uid-0 one (--root-agent-id).
	ownGroup := privileged || len(rootArgs) > 0
	if ownGroup {
		cfg.Args = append(cfg.Args, fmt.Sprintf("--workload-cgroup=%d:%d", p.Limits.MemoryBytes, p.Limits.Pids))
	}
	// The host's cgroup holds the sentry, the gofer and, inside the
	// sentry, the agent and the workload. With the workload in a cgroup of
	// its own inside the sentry, the host's limits are the workload's plus
	// a reserve, so that the workload reaches its own limits first and the
	// sandbox lives on.
	hostLimits := cgroups.Limits{MemoryBytes: p.Limits.MemoryBytes, CPUs: p.Limits.CPUs, Pids: p.Limits.Pids + PidsOverhead}
	if ownGroup {
		hostLimits.MemoryBytes += MemoryReserve + p.Limits.Pids*HostMemoryPerProcess
		hostLimits.Pids = p.Limits.Pids*HostTasksPerProcess + PidsOverhead
	}

	enforced := rt.Enforced{
		{Name: "gvisor", State: rt.StateOK, Detail: fmt.Sprintf("runsc %s, platform %s: the program's system calls are served by gVisor's sentry (a user-space kernel), not the host kernel", rs.Version, Platform)},
		{Name: "seccomp", State: rt.StateOK, Detail: "gVisor's sentry and gofer filters (the host kernel sees only the sentry's own short list; airlock's native per-call list is not needed)"},
		{Name: "filesystem", State: rt.StateOK, Detail: "replaces Landlock: files are served by gVisor's gofer; read-only root template, read-only host binds, writable /workspace and /tmp only"},
		{Name: "pidns", State: rt.StateOK, Detail: "gVisor's own"},
		{Name: "capabilities", State: rt.StateOK, Detail: capsDetail(privileged)},
	}

	var group *cgroups.Group
	cgPath := ""
	info := cgroups.Detect()
	if info.Version == 0 || info.Reason != "" {
		if !cfg.AllowDegraded {
			return nil, &native.SetupError{Step: "cgroups", Err: fmt.Errorf("resource limits cannot be enforced: %s", orUnknown(info.Reason))}
		}
	} else {
		group, err = cgroups.Create(id, hostLimits)
		if err == nil {
			cgPath, err = runscCgroupPath(group)
			if err != nil {
				group.Destroy()
				group = nil
			}
		}
		if err != nil && !cfg.AllowDegraded {
			return nil, &native.SetupError{Step: "cgroups", Err: err}
		}
	}
	switch {
	case group != nil && ownGroup:
		enforced = append(enforced, rt.Layer{Name: "cgroup", State: rt.StateOK,
			Detail: fmt.Sprintf("%s around the sentry and gofer (the workload's limits plus what gVisor costs the host: %d MiB and %d tasks, plus %d MiB and %d tasks for each of the workload's pids)", group.Describe(), MemoryReserve>>20, PidsOverhead, HostMemoryPerProcess>>20, HostTasksPerProcess)})
	case group != nil:
		enforced = append(enforced, rt.Layer{Name: "cgroup", State: rt.StateOK,
			Detail: fmt.Sprintf("%s around the sentry and gofer (pids: %d for the program + %d for gVisor's own threads)", group.Describe(), p.Limits.Pids, PidsOverhead)})
	default:
		reason := info.Reason
		if err != nil {
			reason = err.Error()
		}
		enforced = append(enforced, rt.Layer{Name: "cgroup", State: rt.StateMissing, Detail: "memory, pids and cpu limits NOT enforced: " + orUnknown(reason)})
	}
	if ownGroup {
		enforced = append(enforced, rt.Layer{Name: "workload-cgroup", State: rt.StateOK,
			Detail: fmt.Sprintf("the workload runs in a cgroup of its own inside gVisor's sentry, the agent outside it: pids.max %d (enforced by gVisor: fork answers EAGAIN); memory %d bytes, enforced by the agent, which kills the workload's largest process when gVisor's accounting of the group passes it (gVisor records memory limits but does not enforce them)", p.Limits.Pids, p.Limits.MemoryBytes)})
	}
	enforced = append(enforced,
		rt.Layer{Name: "rlimits", State: rt.StateOK, Detail: fmt.Sprintf("nofile %d, fsize %d, core 0, cpu %s (applied by gVisor)", p.Limits.OpenFiles, p.Limits.FileSizeBytes, p.Limits.CPUTime)},
		rt.Layer{Name: "tmpfs", State: rt.StateOK, Detail: fmt.Sprintf("/tmp and /workspace: gVisor tmpfs capped at %d bytes each (inside the sentry's memory)", p.Limits.DiskBytes)},
		inodes,
	)

	enforced = imageEnforced(enforced, img, &cfg)
	if hostDirs != nil {
		enforced = append(enforced, *hostDirs)
	}
	s := &Sandbox{ID: id, runsc: rs, group: group, enforced: enforced, waitDone: make(chan struct{}), img: img}
	if cfg.Image != nil {
		s.upper = cfg.Image.UpperDir()
	}
	fail := func(step string, err error) (*Sandbox, error) {
		img.Abort()
		unstageHostDirs(id)
		s.closeNet()
		if s.nsPath != "" {
			unpinNetns(id)
		}
		for _, l := range s.listeners {
			l.Close()
		}
		if s.dir != "" {
			os.RemoveAll(s.dir)
		}
		if group != nil {
			group.Destroy()
		}
		return nil, &native.SetupError{Step: step, Err: err}
	}
	for _, d := range []string{runscRoot, filepath.Join(StateBase, "bundles")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fail("state directory", err)
		}
	}
	s.dir = filepath.Join(StateBase, "bundles", id)
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		s.dir = ""
		return fail("state directory", err)
	}
	if cfg.Agent {
		if err := s.setToken(image); err != nil {
			return fail("agent token", err)
		}
	}
	if err := s.saveUpper(); err != nil {
		return fail("state directory", err)
	}
	if err := s.makeNetns(cfg); err != nil {
		return fail("network", err)
	}
	bundle := filepath.Join(s.dir, "bundle")
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return fail("bundle", err)
	}
	spec := buildSpec(&p, &cfg, layout, cgPath, s.nsPath, privileged || len(mounts) > 0)
	imageSpec(spec, img)
	rootAgentSpec(spec, &p, &cfg, len(mounts) > 0)
	if hostDirs != nil {
		spec.Linux.Seccomp = noSetIDSeccomp()
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return fail("bundle", err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return fail("bundle", err)
	}

	s.surviveParent = cfg.SurviveParent
	args := []string{"run", "--bundle", bundle, id}
	if image != "" {
		args = append([]string{"restore"}, restoreFlags(image, bundle, id)...)
	}
	if err := s.launch(args, cfg.Stdin, cfg.Stdout, cfg.Stderr); err != nil {
		return fail("start runsc", err)
	}
	img.Started()
	return s, nil
}

// launch starts `runsc CMD...` for the sandbox with the given stdio (nil
// means /dev/null).
func (s *Sandbox) launch(args []string, stdin, stdout, stderr *os.File) error {
	s.cmd = exec.Command(s.runsc.Path, append(s.globalFlags(), args...)...)
	// A nil *os.File must stay a nil interface: exec.Cmd then uses /dev/null.
	if stdin != nil {
		s.cmd.Stdin = stdin
	}
	if stdout != nil {
		s.cmd.Stdout = stdout
	}
	if stderr != nil {
		s.cmd.Stderr = stderr
	}
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := s.cmd.Start
	if !s.surviveParent {
		s.cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
		start = func() error { return launcher.Run(s.cmd.Start) }
	}
	if err := start(); err != nil {
		return err
	}
	s.Pid = s.cmd.Process.Pid
	s.Started = time.Now()
	return nil
}

// Checkpoint saves the sandbox's whole state (memory, processes, open
// files, its tmpfs /workspace and /tmp) to directory image with `runsc
// checkpoint`, which stops it: the memory is freed, runsc exits and Wait
// returns. The bundle and the cgroup stay for Restore; Destroy removes
// them.
//
// A sandbox with network keeps its egress namespace for Restore: its
// listening sockets come back, its connections come back broken (EPIPE,
// as gVisor restores host sockets).
func (s *Sandbox) Checkpoint(image string) error { return s.CheckpointHolding(image) }

// Snapshot saves the sandbox's whole state to directory image, as
// Checkpoint does, but leaves it running (runsc checkpoint
// --leave-running): Fork starts copies from the image.
//
// A sandbox with an image root has its root's changes on the host, in its
// upper directory, not in the memory image: it is paused (runsc pause)
// around the checkpoint, which flushes the sentry's file state to the
// gofer and leaves the kernel paused, and its upper directory is copied
// into image/tier.SnapshotRootLayer while nothing runs, so that the copy
// is the root the memory image saw. Then it resumes.
func (s *Sandbox) Snapshot(image string) error {
	if err := os.MkdirAll(image, 0o700); err != nil {
		return fmt.Errorf("gvisor: snapshot: %w", err)
	}
	if s.upper != "" {
		if err := s.runscCmd("pause", s.ID); err != nil {
			return err
		}
	}
	err := s.runscCmd(append([]string{"checkpoint", "--leave-running"}, checkpointFlags(image, s.ID)...)...)
	if err == nil && s.upper != "" {
		err = copyTree(s.upper, filepath.Join(image, tier.SnapshotRootLayer))
	}
	if s.upper != "" {
		if rerr := s.runscCmd("resume", s.ID); rerr != nil {
			// Left paused it would hang every request: it ends instead.
			s.Kill()
			return errors.Join(err, fmt.Errorf("%w (the sandbox was killed)", rerr))
		}
	}
	if err != nil {
		return err
	}
	return dropCache(image)
}

// runscCmd runs `runsc ARGS...` for the sandbox and waits for it.
func (s *Sandbox) runscCmd(args ...string) error {
	out, err := exec.Command(s.runsc.Path, append(s.globalFlags(), args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("gvisor: runsc %s: %v: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copyTree copies the overlay upper directory src to dst as it is: owners,
// modes, times, hard links, extended attributes (overlayfs's trusted.*
// opaque and redirect marks) and whiteouts (character devices 0:0), with
// cp -a, which does each of these where a hand-written walk easily misses
// one. dst must not exist.
func copyTree(src, dst string) error {
	if out, err := exec.Command("cp", "-a", "--no-dereference", "--", src, dst).CombinedOutput(); err != nil {
		os.RemoveAll(dst)
		return fmt.Errorf("gvisor: copy the root's upper directory: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// agentTmpfs returns the agent's "--tmpfs=TARGET=OPTIONS" arguments for
// the layout's tmpfs mounts that carry an inode limit (/workspace, /tmp,
// /dev/shm), and whether every one of them got one. A tmpfs with other
// mounts under it (binds into /workspace) is left to runsc, without its
// inode limit: a tmpfs the agent mounts over it would hide them.
func agentTmpfs(l *native.Layout) ([]string, bool) {
	var args []string
	all := true
	for _, m := range l.Mounts {
		if m.Type != "tmpfs" || !slices.ContainsFunc(m.Options, func(o string) bool { return strings.HasPrefix(o, "nr_inodes=") }) {
			continue
		}
		if slices.ContainsFunc(l.Mounts, func(o native.LayoutMount) bool { return strings.HasPrefix(o.Target, m.Target+"/") }) {
			all = false
			continue
		}
		args = append(args, "--tmpfs="+m.Target+"="+strings.Join(m.Options, ","))
	}
	return args, all && len(args) > 0
}

// capsDetail describes the capabilities inside: the agent's when it
// starts privileged to mount its tmpfs.
func capsDetail(agentPrivileged bool) string {
	if agentPrivileged {
		return fmt.Sprintf("none for the workload; the agent starts as root with sys_admin, setpcap, kill, setuid, setgid and dac_override to mount its tmpfs and the workload's cgroup, then keeps only kill, setuid and setgid "+
			"(and dac_override on the one thread that clones workload processes into their cgroup, whose files are root's) under real and saved uid %d (effective uid the workload's, so that its files are the workload's): the workload cannot prlimit, signal or trace it; no_new_privs", native.AgentUID)
	}
	return "none inside; no_new_privs"
}

// checkpointFlags are `runsc checkpoint`'s flags (after the subcommand)
// for an image in directory image: pages written with O_DIRECT where the
// file system takes it (no page cache to charge to the sandbox's cgroup,
// write out and drop afterwards: a pause of a 100 MB session spent 80-100
// ms in dropCache without it), committed zero pages left out (they come
// back as zero pages), uncompressed (runsc's default, which restore
// needs to load pages directly and in the background).
func checkpointFlags(image, id string) []string {
	f := []string{"--exclude-committed-zero-pages", "--image-path", image, id}
	if directIO(image) {
		f = append([]string{"--direct"}, f...)
	}
	return f
}

// restoreFlags are `runsc restore`'s flags for an image in directory
// image: pages read with O_DIRECT where the file system takes it, so that
// the image does not pass through the page cache charged to the sandbox,
// and in the background (lazily): restore returns once the sentry's state
// is loaded, and the memory's pages follow while the sandbox runs (a task
// that touches a page not yet read waits for it). The sentry holds the
// image's files open until every page is in, so the caller may remove the
// image as soon as restore returns; a later checkpoint waits for the
// loading to finish (pgalloc's SaveTo calls AwaitLoadAll), and an image
// that fails to read mid-way ends the sandbox, as a failed restore does.
func restoreFlags(image, bundle, id string) []string {
	f := []string{"--background", "--image-path", image, "--bundle", bundle, id}
	if directIO(image) {
		f = append([]string{"--direct"}, f...)
	}
	return f
}

// directIO reports whether files in directory dir can be opened with
// O_DIRECT (not every file system takes it).
func directIO(dir string) bool {
	f, err := os.CreateTemp(dir, ".direct-")
	if err != nil {
		return false
	}
	name := f.Name()
	f.Close()
	defer os.Remove(name)
	fd, err := unix.Open(name, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// dropCache writes the files under dir to disk and drops them from the
// page cache.
func dropCache(dir string) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Errorf("gvisor: sync checkpoint image: %w", err)
		}
		return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	})
}

// Restore starts a checkpointed sandbox again from image with `runsc
// restore`, with new stdio: programs inside read and write the new
// descriptors where they had the old ones. It returns the running sandbox;
// s is spent (do not Destroy it: the returned one owns the bundle and the
// cgroup).
func (s *Sandbox) Restore(image string, stdin, stdout, stderr *os.File) (*Sandbox, error) {
	n := &Sandbox{ID: s.ID, runsc: s.runsc, dir: s.dir, group: s.group, enforced: s.enforced,
		surviveParent: s.surviveParent, waitDone: make(chan struct{}), netns: s.netns, nsPath: s.nsPath, token: s.token, img: s.img, upper: s.upper}
	if err := n.launch(append([]string{"restore"}, restoreFlags(image, filepath.Join(s.dir, "bundle"), s.ID)...), stdin, stdout, stderr); err != nil {
		return nil, fmt.Errorf("gvisor: start runsc restore: %w", err)
	}
	return n, nil
}

// Adopt takes over sandbox id, checkpointed (stopped) by a previous
// process that is gone, for Restore: its bundle and its cgroup, which
// the checkpoint left, are kept; nothing runs. enforced is what that
// process reported for it.
//
// A sandbox with network had its egress namespace held by that process,
// gone with it: Adopt makes a fresh one with the proxy's listeners at
// listen (as Start does; the caller serves them, Listeners) and points the
// bundle at it, which runsc restore allows (a namespace's path may change
// across a restore). Without listen such a sandbox is refused
// (ErrNetworkAdopt).
func Adopt(id string, enforced rt.Enforced, listen []string) (*Sandbox, error) {
	if !validID(id) {
		return nil, fmt.Errorf("gvisor: bad sandbox id %q", id)
	}
	rs, err := Available()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(StateBase, "bundles", id)
	data, err := os.ReadFile(filepath.Join(dir, "bundle", "config.json"))
	if err != nil {
		return nil, fmt.Errorf("gvisor: adopt %s: no bundle: %w", id, err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil || spec.Linux == nil {
		return nil, fmt.Errorf("gvisor: adopt %s: bad bundle: %v", id, err)
	}
	netIdx := slices.IndexFunc(spec.Linux.Namespaces, func(ns specs.LinuxNamespace) bool {
		return ns.Type == specs.NetworkNamespace && ns.Path != ""
	})
	if netIdx >= 0 && len(listen) == 0 {
		return nil, fmt.Errorf("gvisor: adopt %s: %w", id, ErrNetworkAdopt)
	}
	group, err := cgroups.Lookup(id)
	if err != nil {
		return nil, fmt.Errorf("gvisor: adopt %s: %w", id, err)
	}
	// Restored, it outlives this process as the sandboxes of a server do
	// (a crash mid pause must not kill it before runsc has its image).
	s := &Sandbox{ID: id, runsc: rs, dir: dir, group: group, enforced: enforced, waitDone: make(chan struct{}), surviveParent: true}
	s.token, _ = readToken(dir) // absent for a one-shot run's state
	s.upper = readUpper(dir)
	if netIdx >= 0 {
		if err := s.adoptNetns(&spec, netIdx, listen); err != nil {
			return nil, fmt.Errorf("gvisor: adopt %s: %w", id, err)
		}
	}
	return s, nil
}

// writeSpec replaces bundle/config.json with spec, atomically.
func writeSpec(bundle string, spec *specs.Spec) error {
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("bundle: %w", err)
	}
	tmp := filepath.Join(bundle, "config.json.tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("bundle: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(bundle, "config.json")); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("bundle: %w", err)
	}
	return nil
}

// MemoryReserve is added to the policy's memory limit in the sandbox's
// host cgroup when the workload has a cgroup of its own inside the sentry:
// the agent's and the sentry's own memory, and what a fast allocation adds
// between two looks of the agent's memory watch.
const MemoryReserve = 128 << 20

// HostMemoryPerProcess is what one workload process costs the host
// beyond the memory gVisor accounts to the workload (its systrap stub
// process and page tables, the sentry's task): measured at about 3.4 MiB
// per process with a fork bomb of python3 processes. The host's memory
// limit adds it for every pid the workload may hold, so that a fork bomb
// meets the workload's pids.max before the host's memory limit.
const HostMemoryPerProcess = 4 << 20

// HostTasksPerProcess is how many host tasks one workload process may cost
// under systrap (the process's stub and its threads; measured at 2 in a
// steady state): the host's pids limit is the workload's times this plus
// PidsOverhead, so that the workload meets gVisor's own pids.max first.
//
// A fork bomb's churn costs more for a moment (stubs of exited processes
// not yet gone, the sentry's threads blocked in the host): a bomb at 32
// pids peaked at 98-106 host tasks at load 6 (/proc sampled every few ms,
// 6 rounds), and in CI, at a higher load, the old limit of 3x+64 = 160 was
// met: the sentry could not give the agent a thread and the agent died
// (Go's "failed to create new OS thread", exit status 2; the same end
// comes at once with the limit cut to 1x+24). Hence 4x+128: 256 at 32.
const HostTasksPerProcess = 4

// PidsOverhead is added to the policy's pids limit in the sandbox's host
// cgroup, for the sentry's and the gofer's own threads (about 20 when
// idle, more while the workload keeps it busy) and the agent's. gVisor
// does not count the program's processes itself: each costs the host
// about two tasks (its systrap stub), all held by the same limit.
const PidsOverhead = 128

// globalFlags are runsc's flags for this sandbox.
func (s *Sandbox) globalFlags() []string {
	f := runscFlags()
	if s.nsPath != "" {
		// Inside the sandbox's namespace (see egressNetns): the sentry's
		// sockets are host sockets there, where only the proxy listens.
		for i := range f {
			if f[i] == "--network=none" {
				f[i] = "--network=host"
			}
		}
	}
	return f
}

// Listeners returns the egress proxy's listeners opened in the sandbox's
// network namespace (in the order of Config.Listen); the caller owns them.
func (s *Sandbox) Listeners() []net.Listener { return s.listeners }

// closeNet drops this process's handle on the egress namespace.
func (s *Sandbox) closeNet() {
	if s.netns != nil {
		s.netns.Close()
	}
}

// runscFlags are runsc's flags for airlock's sandboxes. With
// --in-sandbox-cgroup=v2 the agent can mount gVisor's cgroup2 and put the
// workload in a group of its own (its pids.max is enforced there; v1's is
// not reliably: the sentry charges a fork to whichever v1 hierarchy it
// meets first).
func runscFlags() []string {
	return []string{"--root", runscRoot, "--rootless=false", "--platform=" + Platform,
		"--network=none", "--overlay2=none", "--host-uds=none", "--host-fifo=none", "--in-sandbox-cgroup=v2", "--oci-seccomp"}
}

// Remove kills what is left of sandbox id after the process that started
// it died (runsc delete --force: the sentry, the gofer, runsc's state and
// the cgroups runsc made) and removes its state directory. The airlock
// cgroup itself is the caller's to remove.
func Remove(id string) error {
	if !validID(id) {
		return fmt.Errorf("gvisor: bad sandbox id %q", id)
	}
	dir := filepath.Join(StateBase, "bundles", id)
	rs, err := Find()
	if err == nil {
		_ = exec.Command(rs.Path, append(runscFlags(), "delete", "--force", id)...).Run()
	}
	removeRunscLeftovers(id)
	unpinNetns(id)
	if err := unstageHostDirs(id); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// prepareWorkspace makes a host workspace directory usable by the sandbox
// user. gVisor's gofer creates files with the sandbox's own uid and gid
// (no user namespace mapping), so a missing directory is created owned by
// them; an existing one of another unprivileged owner is ID-mapped onto
// them (mapHostDirs), as native does; airlock never chowns a user's files.
func prepareWorkspace(dir string, uid, gid int) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create workspace: %w", err)
		}
		if err := os.Lchown(dir, uid, gid); err != nil {
			return fmt.Errorf("chown workspace: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("workspace %s is not a directory", dir)
	}
	return nil
}

// hasRunscState reports whether runsc keeps state for sandbox id.
func hasRunscState(id string) bool {
	m, _ := filepath.Glob(filepath.Join(runscRoot, "*"+id+"*.state"))
	return len(m) > 0
}

// removeRunscLeftovers removes what runsc may leave of a dead sandbox
// id: its lock file, and the (empty) cgroup v1 directories it made in
// hierarchies airlock does not manage (cpuset, devices, blkio...).
func removeRunscLeftovers(id string) {
	if !hasRunscState(id) {
		locks, _ := filepath.Glob(filepath.Join(runscRoot, "*"+id+"*.lock"))
		for _, l := range locks {
			_ = os.Remove(l)
		}
	}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/airlock/" + id)
	for _, d := range dirs {
		_ = os.Remove(d)
	}
}

// validID reports whether id can name a state directory (as sandbox and
// run ids do: [a-z0-9-]).
func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// runscCgroupPath is the group's path as runsc's OCI cgroupsPath: relative
// to the root of every hierarchy the group lives in.
func runscCgroupPath(g *cgroups.Group) (string, error) {
	var rel string
	for _, d := range g.Dirs() {
		var r string
		if g.Version() == 1 {
			// /sys/fs/cgroup/<controller>/<path>
			rest, ok := strings.CutPrefix(d, "/sys/fs/cgroup/")
			if !ok {
				return "", fmt.Errorf("cgroup %s is not under /sys/fs/cgroup", d)
			}
			_, r, _ = strings.Cut(rest, "/")
			r = "/" + r
		} else {
			rest, ok := strings.CutPrefix(d, "/sys/fs/cgroup/")
			if !ok || strings.HasPrefix(rest, "unified/") {
				return "", fmt.Errorf("cgroup v2 group %s is not on a pure cgroup v2 host, which runsc needs", d)
			}
			r = "/" + rest
		}
		if rel != "" && r != rel {
			return "", fmt.Errorf("cgroup %s: hierarchies disagree on the path (%s, %s)", g.Name(), rel, r)
		}
		rel = r
	}
	if rel == "" {
		return "", errors.New("cgroup has no directories")
	}
	return rel, nil
}

// buildSpec translates the policy and the native root layout to an OCI spec.
//
// A privileged agent (it mounts the tmpfs itself, see agentTmpfs, and
// takes an identity of its own) starts as uid 0 inside gVisor with
// CAP_SYS_ADMIN, CAP_SETPCAP, CAP_KILL, CAP_SETUID and CAP_SETGID only,
// and before it serves keeps kill, setuid and setgid under uid
// native.AgentUID (the agent's mountTmpfs and becomeAgent).
func buildSpec(p *policy.Policy, cfg *native.Config, l *native.Layout, cgPath, netnsPath string, privilegedAgent bool) *specs.Spec {
	lim := p.Limits
	rl := func(typ string, v uint64) specs.POSIXRlimit { return specs.POSIXRlimit{Type: typ, Hard: v, Soft: v} }
	oom := native.OOMScoreAdj
	spec := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: cfg.Args,
			Env:  p.Env,
			Cwd:  orDefault(p.Filesystem.Workdir, "/"),
			User: specs.User{UID: uint32(p.User.UID), GID: uint32(p.User.GID)},
			Rlimits: []specs.POSIXRlimit{
				rl("RLIMIT_NOFILE", lim.OpenFiles), rl("RLIMIT_FSIZE", uint64(lim.FileSizeBytes)),
				rl("RLIMIT_CORE", 0), rl("RLIMIT_CPU", uint64(lim.CPUTime.Seconds())),
			},
			NoNewPrivileges: true,
			Capabilities:    &specs.LinuxCapabilities{},
			OOMScoreAdj:     &oom,
		},
		Root:     &specs.Root{Path: l.Root, Readonly: true},
		Hostname: p.User.Hostname,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace, Path: netnsPath}},
			CgroupsPath: cgPath,
		},
	}
	if privilegedAgent {
		caps := []string{"CAP_SYS_ADMIN", "CAP_SETPCAP", "CAP_KILL", "CAP_SETUID", "CAP_SETGID", "CAP_DAC_OVERRIDE"}
		spec.Process.User = specs.User{UID: 0, GID: 0}
		spec.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	}
	for _, m := range l.Mounts {
		switch {
		case m.Type == "devpts":
			continue // gVisor mounts its own devpts
		case m.Type == "bind" && strings.HasPrefix(m.Target, "/dev/"):
			continue // gVisor's /dev has null, zero, full, random, urandom, tty of its own
		case m.Type == "bind":
			spec.Mounts = append(spec.Mounts, specs.Mount{Destination: m.Target, Type: "bind", Source: m.Source, Options: m.Options})
		default:
			spec.Mounts = append(spec.Mounts, specs.Mount{Destination: m.Target, Type: m.Type, Source: m.Type, Options: m.Options})
		}
	}
	return spec
}

// Wait waits for `runsc run` to exit (the program has ended and gVisor is
// going down). Safe to call many times, concurrently too.
func (s *Sandbox) Wait() (*os.ProcessState, error) {
	s.waitOnce.Do(func() {
		if s.cmd == nil { // adopted: runsc was never started here
			if s.exited != nil {
				<-s.exited
			}
			close(s.waitDone)
			return
		}
		err := s.cmd.Wait()
		if _, exited := err.(*exec.ExitError); exited {
			err = nil // a nonzero exit is the program's (or runsc's) status
		}
		s.state, s.waitErr = s.cmd.ProcessState, err
		close(s.waitDone)
	})
	return s.state, s.waitErr
}

// ExitDetail says how `runsc` ended (its exit status, or the signal that
// killed it, as Wait saw it), for the log line of an unexpected end.
func (s *Sandbox) ExitDetail() string {
	select {
	case <-s.waitDone:
	default:
		return "runsc is still running"
	}
	switch {
	case s.waitErr != nil:
		return "runsc: " + s.waitErr.Error()
	case s.state == nil:
		return "runsc was not started by this process"
	}
	ws := s.state.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return fmt.Sprintf("runsc (pid %d) killed by signal %d (%v) after %s", s.Pid, int(ws.Signal()), ws.Signal(), time.Since(s.Started).Round(time.Millisecond))
	}
	return fmt.Sprintf("runsc (pid %d) exited with status %d after %s", s.Pid, ws.ExitStatus(), time.Since(s.Started).Round(time.Millisecond))
}

// Done is closed when Wait has returned.
func (s *Sandbox) Done() <-chan struct{} { return s.waitDone }

// Kill kills every process of the sandbox: the sentry and gofer through
// the cgroup (so nothing of the sandbox survives runsc), then runsc.
func (s *Sandbox) Kill() {
	if s.group != nil {
		_ = s.group.Kill()
	} else {
		_ = exec.Command(s.runsc.Path, append(s.globalFlags(), "kill", "--all", s.ID, "KILL")...).Run()
	}
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
	}
}

// Stats returns the sandbox's cgroup accounting (sentry and gofer
// included).
func (s *Sandbox) Stats() (cgroups.Stats, error) {
	if s.group == nil {
		return cgroups.Stats{}, errors.New("no cgroup: accounting unavailable")
	}
	return s.group.Stats()
}

// Enforced lists the isolation layers applied to this sandbox.
func (s *Sandbox) Enforced() rt.Enforced { return s.enforced }

// Destroy kills the sandbox, reaps it, lets runsc remove its state and
// removes the cgroup and the bundle. Idempotent.
func (s *Sandbox) Destroy() error {
	var err error
	s.destroy.Do(func() {
		s.Kill()
		s.Wait()
		// runsc's own state and the cgroups it created in the other
		// hierarchies (cpuset, devices...) go with delete --force, if
		// runsc did not remove them itself (it does when the program
		// exits on its own).
		if hasRunscState(s.ID) {
			_ = exec.Command(s.runsc.Path, append(s.globalFlags(), "delete", "--force", s.ID)...).Run()
		}
		removeRunscLeftovers(s.ID)
		s.closeNet()
		s.img.Unmount()
		uerr := unstageHostDirs(s.ID)
		if s.nsPath != "" {
			unpinNetns(s.ID)
		}
		if s.group != nil {
			err = s.group.Destroy()
		}
		if rerr := os.RemoveAll(s.dir); rerr != nil && err == nil {
			err = rerr
		}
		if err == nil {
			err = uerr
		}
	})
	return err
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func orUnknown(s string) string { return orDefault(s, "unknown reason") }
