package native

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/native/seccomp"
)

// OOMScoreAdj is the oom_score_adj of every sandbox process: when the host
// runs out of memory, the kernel kills sandboxes before anything else.
const OOMScoreAdj = 500

// testBreak deliberately disables one layer ("seccomp", "landlock") so
// tests can show that their assertions fail without it. Only tests set it.
var testBreak string

// Sandbox is a started native sandbox: its init process (the program, or
// the agent) is PID 1 of a fresh pid namespace, so when it exits the kernel
// kills everything else inside.
type Sandbox struct {
	// ID names the sandbox.
	ID string
	// Pid is the host pid of the sandbox's init process.
	Pid int
	// Started is when the init process was released to exec.
	Started time.Time

	pidfd    int // the init's pidfd; -1 once closed (guarded by mu)
	group    *cgroups.Group
	workload *cgroups.Group   // the workload's child group (Config.Agent, cgroup v1), or nil
	split    *cgroups.V2Split // the agent and workload leaves (Config.Agent, cgroup v2), or nil
	enforced rt.Enforced

	listeners []net.Listener

	mu       sync.Mutex
	waited   bool
	traced   bool // a task stopped under our tracing: killed for it
	killing  bool // reapAfterKill is running
	state    *ExitState
	waitErr  error
	waitDone chan struct{}
	destroy  sync.Once
	detached chan struct{} // closed once an image root's host mount is gone; nil without one
}

// NewID returns a random sandbox id.
func NewID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sb-" + hex.EncodeToString(b[:])
}

var stagingOnce struct {
	sync.Once
	dir string
	err error
}

// stagingDir is the private host directory holding root templates.
func stagingDir() (string, error) {
	stagingOnce.Do(func() {
		base := "/run/airlock"
		if os.Geteuid() != 0 {
			if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" {
				base = path.Join(x, "airlock")
			} else {
				base = fmt.Sprintf("/tmp/airlock-%d", os.Geteuid())
			}
		}
		dir := path.Join(base, "templates")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			stagingOnce.err = fmt.Errorf("create staging dir: %w", err)
			return
		}
		// Refuse a staging dir that someone else controls.
		for _, p := range []string{base, dir} {
			fi, err := os.Lstat(p)
			if err != nil {
				stagingOnce.err = err
				return
			}
			st := fi.Sys().(*syscall.Stat_t)
			if !fi.IsDir() || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
				stagingOnce.err = fmt.Errorf("staging dir %s is not a private directory owned by uid %d", p, os.Geteuid())
				return
			}
		}
		stagingOnce.dir = dir
	})
	return stagingOnce.dir, stagingOnce.err
}

var lastCapOnce struct {
	sync.Once
	v uintptr
}

// lastCap is the highest capability number the kernel knows.
func lastCap() uintptr {
	lastCapOnce.Do(func() {
		lastCapOnce.v = 63
		if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
			var n int
			if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &n); err == nil {
				lastCapOnce.v = uintptr(n)
			}
		}
	})
	return lastCapOnce.v
}

// candidates returns the paths execve tries for argv0, in PATH order.
func candidates(argv0 string, env []string) []string {
	if strings.Contains(argv0, "/") {
		return []string{argv0}
	}
	pathEnv := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	var out []string
	for _, d := range strings.Split(pathEnv, ":") {
		if d == "" || !path.IsAbs(d) {
			continue
		}
		out = append(out, path.Join(d, argv0))
	}
	return out
}

func cstrs(ss []string) []*byte {
	out := make([]*byte, 0, len(ss)+1)
	for _, s := range ss {
		out = append(out, cstr(s))
	}
	return append(out, nil)
}

// stdioFd returns a descriptor >= 3 for f (or /dev/null), owned by the caller.
func stdioFd(f *os.File, write bool) (int, error) {
	if f == nil {
		flag := unix.O_RDONLY
		if write {
			flag = unix.O_WRONLY
		}
		return unix.Open("/dev/null", flag|unix.O_CLOEXEC, 0)
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 3)
	runtime.KeepAlive(f)
	return fd, err
}

// Start builds and starts a sandbox. The program has been exec'ed (or
// failed to) when Start returns.
func Start(cfg Config) (*Sandbox, error) {
	p := cfg.Policy
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("invalid policy: %w", err)
	}
	if p.Runtime != "" && p.Runtime != policy.RuntimeNative {
		return nil, fmt.Errorf("policy asks for runtime %q: not the native runtime's to run", p.Runtime)
	}
	if cfg.ControllingTerminal && cfg.Stdin == nil {
		return nil, errors.New("a controlling terminal needs a terminal as stdin")
	}
	if len(cfg.Args) == 0 || cfg.Args[0] == "" {
		return nil, errors.New("no command given")
	}
	if p.User.Root && (cfg.Image == nil || os.Geteuid() != 0) {
		return nil, errors.New("user root needs an image root (--image, \"image\") and airlock running as root: the default root is the host's read-only /usr, where root has nothing to install into")
	}
	for _, s := range append(append([]string{}, cfg.Args...), p.Env...) {
		if strings.IndexByte(s, 0) >= 0 {
			return nil, errors.New("argument or environment contains a NUL byte")
		}
	}
	id := cfg.ID
	if id == "" {
		id = NewID()
	}
	ids, lease, err := mapping(cfg.HostIDBase, p.User.UID, p.User.GID, p.Filesystem.Workspace)
	if err != nil {
		return nil, err
	}
	leaseKept := false // a range leased here is freed on failure, or once the init is reaped
	defer func() {
		if !leaseKept {
			lease.Release()
		}
	}()
	if p.Filesystem.Workspace != "" {
		if err := prepareWorkspace(p.Filesystem.Workspace, ids); err != nil {
			return nil, err
		}
	}
	workspaceDir := p.Filesystem.Workspace
	hostDirs, err := attachHostDirs(&p, ids, id)
	if err != nil {
		return nil, &SetupError{Step: "host directories", Err: err}
	}
	defer hostDirs.undo()
	detachVolumes, err := attachVolumes(&p, cfg.Volumes, ids.hostUID-p.User.UID, id)
	if err != nil {
		return nil, &SetupError{Step: "volumes", Err: err}
	}
	defer detachVolumes()
	if err := checkWritableMounts(p.Filesystem.Mounts, ids); err != nil {
		return nil, err
	}
	root, err := stagingDir()
	if err != nil {
		return nil, err
	}
	if cfg.Image != nil {
		imagePolicy(&p)
	}
	tree, err := cachedTree(root, &p, &cfg, false)
	if err != nil {
		return nil, &SetupError{Step: "root filesystem", Err: err}
	}
	var ov *overlayRoot // an image root: mounted on the host until the child has its copy
	var detached chan struct{}
	startDetach := func() {}
	if cfg.Image != nil {
		if tree, ov, err = imageTree(tree, cfg.Image, ids.hostUID-p.User.UID, &p); err != nil {
			return nil, &SetupError{Step: "image root", Err: err}
		}
		detached = make(chan struct{})
		// The host's view goes once the child has its copy; the unmount
		// waits for an RCU grace period (milliseconds), so it runs beside
		// the sandbox instead of on the create path, and Wait waits for it.
		// It starts once the child has exec'd or failed (a failed child is
		// waited for below, and Wait waits for the detach), else on return.
		var once sync.Once
		startDetach = func() {
			once.Do(func() {
				go func() {
					ov.detach()
					close(detached)
				}()
			})
		}
		defer startDetach()
	}
	guards := seccomp.Guards{NoSetID: hostDirs.mapped()}
	if p.User.Root && cfg.Agent {
		guards.ProtectID = AgentUID // CAP_SETUID must not reach the agent's uid
	}
	filter, err := seccomp.BuildWith(string(p.Profile), guards)
	if err != nil {
		return nil, &SetupError{Step: "seccomp", Err: err}
	}

	enforced := rt.Enforced{
		{Name: "userns", State: rt.StateOK, Detail: ids.desc},
		{Name: "pidns", State: rt.StateOK},
		{Name: "mountns", State: rt.StateOK, Detail: "pivot_root onto a read-only root (a template directory bound onto itself), old root detached"},
		{Name: "netns", State: rt.StateOK, Detail: "empty (loopback only)"},
		{Name: "ipcns", State: rt.StateOK},
		{Name: "utsns", State: rt.StateOK},
		{Name: "cgroupns", State: rt.StateOK},
	}

	var group *cgroups.Group
	info := cgroups.Detect()
	if info.Version == 0 || info.Reason != "" {
		if !cfg.AllowDegraded {
			return nil, &SetupError{Step: "cgroups", Err: fmt.Errorf("resource limits cannot be enforced: %s (run as root on a host with cgroups, or allow degraded mode explicitly)", orUnknown(info.Reason))}
		}
	} else {
		group, err = cgroups.Create(id, cgroups.Limits{MemoryBytes: p.Limits.MemoryBytes, CPUs: p.Limits.CPUs, Pids: p.Limits.Pids})
		if err != nil && !cfg.AllowDegraded {
			return nil, &SetupError{Step: "cgroups", Err: err}
		}
	}
	var workload *cgroups.Group
	var split *cgroups.V2Split
	if group != nil && cfg.Agent && group.Version() == 2 {
		// The agent keeps a reserve of pids and memory the workload cannot
		// take: agent and workload get sibling leaves, and the agent clones
		// every workload process into its leaf (CLONE_INTO_CGROUP).
		auid, agid := agentIDs(p, ids)
		sp, serr := group.SplitV2(cgroups.Limits{MemoryBytes: p.Limits.MemoryBytes, Pids: p.Limits.Pids}, AgentReservePids, AgentReserveMemory, auid, agid)
		if serr == nil {
			split = sp
			guards.Clone3 = true
			if filter, err = seccomp.BuildWith(string(p.Profile), guards); err != nil {
				destroyGroup(group)
				return nil, &SetupError{Step: "seccomp", Err: err}
			}
			enforced = append(enforced, rt.Layer{Name: "agent_reserve", State: rt.StateOK,
				Detail: fmt.Sprintf("cgroup v2: the workload runs in its own leaf (cloned into it: CLONE_INTO_CGROUP) with the pids and memory limits; the agent's sibling leaf keeps %d pids and %d MiB", AgentReservePids, AgentReserveMemory>>20)})
		} else {
			enforced = append(enforced, rt.Layer{Name: "agent_reserve", State: rt.StateDegraded,
				Detail: "the agent shares the workload's pids and memory limits: " + serr.Error()})
		}
	} else if group != nil && cfg.Agent {
		// The agent keeps a reserve of pids and memory the workload cannot
		// take: the workload lives in a child group with the policy's limits.
		wl, serr := group.Split(cgroups.Limits{MemoryBytes: p.Limits.MemoryBytes, Pids: p.Limits.Pids}, AgentReservePids, AgentReserveMemory)
		if serr == nil {
			workload = wl
			enforced = append(enforced, rt.Layer{Name: "agent_reserve", State: rt.StateOK,
				Detail: fmt.Sprintf("the workload's pids and memory limits apply to a child cgroup; the agent keeps %d pids and %d MiB of its own", AgentReservePids, AgentReserveMemory>>20)})
		} else {
			enforced = append(enforced, rt.Layer{Name: "agent_reserve", State: rt.StateDegraded,
				Detail: "the agent shares the workload's pids and memory limits: " + serr.Error()})
		}
	}
	if group != nil {
		enforced = append(enforced, rt.Layer{Name: "cgroup", State: rt.StateOK, Detail: group.Describe()})
	} else {
		reason := info.Reason
		if err != nil {
			reason = err.Error()
		}
		enforced = append(enforced, rt.Layer{Name: "cgroup", State: rt.StateMissing,
			Detail: "memory, pids and cpu limits NOT enforced (rlimits only): " + orUnknown(reason)})
	}

	pl := &plan{
		cloneFlags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		unshareCg:  true,
		ops:        tree.ops,
		remount:    tree.remount,
		newRoot:    cstr(tree.root),
		dot:        cstr("."),
		slash:      cstr("/"),
		hostname:   []byte(p.User.Hostname),
		securebits: secureNoRoot,
		rlimits:    rlimitsFor(p.Limits, group != nil),
		lastCap:    lastCap(),
		setgroups:  ids.setgroups,
		uid:        uintptr(p.User.UID),
		gid:        uintptr(p.User.GID),
		capHdr:     unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3},
		workdir:    cstr(orDefault(p.Filesystem.Workdir, "/")),
		argv:       cstrs(cfg.Args),
		envv:       cstrs(p.Env),
		ctty:       cfg.ControllingTerminal,
	}
	if p.User.Root {
		pl.securebits = secureRoot
	}
	if cfg.Agent && ids.setgroups {
		if p.User.UID == AgentUID || p.User.GID == AgentUID {
			return nil, fmt.Errorf("policy user %d:%d collides with the agent's uid %d", p.User.UID, p.User.GID, AgentUID)
		}
		pl.uid, pl.gid = AgentUID, AgentUID
		if p.User.Root {
			// CAP_SETGID lets a root workload name any group of the
			// namespace, in setgroups too, whose list seccomp cannot
			// read (ProtectID covers only the calls that pass ids as
			// arguments): the agent's only group is the workload's own,
			// so there is none of the agent's it does not hold already.
			pl.gid = uintptr(p.User.GID)
		}
		for _, c := range AgentCaps {
			pl.keepCaps |= 1 << c
		}
		if p.User.Root { // the agent hands them to the workload (its --root-caps)
			pl.keepCaps |= rootCapMask()
		}
		for i := range pl.capData {
			pl.capData[i].Permitted = uint32(pl.keepCaps >> (32 * i))
			pl.capData[i].Effective = pl.capData[i].Permitted
			pl.capData[i].Inheritable = pl.capData[i].Permitted
		}
		enforced = append(enforced, rt.Layer{Name: "agent", State: rt.StateOK,
			Detail: fmt.Sprintf("agent runs as uid %d gid %d (workload %d:%d), non-dumpable; keeps only kill, setuid, setgid inside the user namespace", AgentUID, pl.gid, p.User.UID, p.User.GID)})
	} else if p.User.Root && !cfg.Agent {
		pl.keepCaps = rootCapMask()
		for i := range pl.capData {
			pl.capData[i].Permitted = uint32(pl.keepCaps >> (32 * i))
			pl.capData[i].Effective = pl.capData[i].Permitted
			pl.capData[i].Inheritable = pl.capData[i].Permitted
		}
	} else if cfg.Agent {
		enforced = append(enforced, rt.Layer{Name: "agent", State: rt.StateDegraded,
			Detail: "unprivileged: the agent shares the workload's uid (non-dumpable, signals caught, but prlimit/setpriority by the workload reach it)"})
	}
	pl.leafFd = -1
	if split != nil {
		// fd 3 of the agent is the workload's leaf; no new namespaces, as
		// clone3 passes seccomp (seccomp.Guards.Clone3).
		leaf, err := split.OpenWorkload()
		if err == nil {
			pl.leafFd, err = unix.FcntlInt(uintptr(leaf), unix.F_DUPFD_CLOEXEC, 4)
			unix.Close(leaf)
		}
		if err != nil {
			destroyGroup(group)
			return nil, &SetupError{Step: "workload cgroup leaf", Err: err}
		}
		defer unix.Close(pl.leafFd)
		pl.argv = cstrs(append(append([]string(nil), cfg.Args...), "--workload-cgroup-fd=3"))
		for _, n := range []string{"user", "mnt", "pid", "net", "ipc", "uts", "cgroup", "time"} {
			pl.nsLimits = append(pl.nsLimits, cstr("/proc/sys/user/max_"+n+"_namespaces"))
		}
		pl.zero[0] = '0'
	}
	pl.oomPath, pl.oomScore = cstr("/proc/self/oom_score_adj"), []byte(strconv.Itoa(OOMScoreAdj))
	copy(pl.ifreqLo[:], "lo")
	binary.NativeEndian.PutUint16(pl.ifreqLo[16:], syscall.IFF_UP|syscall.IFF_RUNNING)
	pl.noPdeath = cfg.SurviveParent
	pl.argv0 = cstrs(candidates(cfg.Args[0], p.Env))
	pl.argv0 = pl.argv0[:len(pl.argv0)-1]
	enforced = append(enforced,
		capsLayer(p.User.Root),
		rt.Layer{Name: "no_new_privs", State: rt.StateOK},
		rt.Layer{Name: "rlimits", State: rt.StateOK, Detail: fmt.Sprintf("nofile %d, fsize %d, core 0, cpu %s", p.Limits.OpenFiles, p.Limits.FileSizeBytes, p.Limits.CPUTime)},
		rt.Layer{Name: "tmpfs", State: rt.StateOK, Detail: fmt.Sprintf("/tmp and /workspace capped at %d bytes, %d inodes", p.Limits.DiskBytes, p.Limits.Inodes)},
	)
	if p.Filesystem.Workspace != "" {
		enforced[len(enforced)-1].Detail = fmt.Sprintf("/tmp capped at %d bytes, %d inodes; /workspace is host dir %s (no size cap)", p.Limits.DiskBytes, p.Limits.Inodes, workspaceDir)
	}
	if hostDirs.mapped() {
		enforced = append(enforced, rt.Layer{Name: "hostdirs", State: rt.StateOK, Detail: hostDirs.describe()})
	}
	if abi, err := LandlockABI(); err == nil && abi > 0 && testBreak != "landlock" {
		pl.llAttr, pl.llRules = landlockPlan(&p, abi)
		pl.llRules = append(pl.llRules, ov.landlockRules(pl.llAttr)...)
		enforced = append(enforced, rt.Layer{Name: "landlock", State: rt.StateOK, Detail: fmt.Sprintf("ABI %d: read-only except /workspace, /tmp, /dev/shm", abi)})
	} else {
		enforced = append(enforced, rt.Layer{Name: "landlock", State: rt.StateMissing, Detail: fmt.Sprint(err)})
	}
	if ov != nil {
		enforced = append(enforced, ov.layer(len(cfg.Image.Layers)))
	}
	if testBreak != "seccomp" {
		prog := unix.SockFprog{Len: uint16(len(filter.Instructions)), Filter: &filter.Instructions[0]}
		pl.seccomp = &prog
		enforced = append(enforced, rt.Layer{Name: "seccomp", State: rt.StateOK, Detail: filter.Describe()})
	}

	// Descriptors: stdio >= 3, a sync pipe and an error pipe.
	var fds []int
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
		fds = nil
	}
	for i, f := range []*os.File{cfg.Stdin, cfg.Stdout, cfg.Stderr} {
		fd, err := stdioFd(f, i > 0)
		if err != nil {
			closeAll()
			destroyGroup(group)
			return nil, fmt.Errorf("stdio: %w", err)
		}
		pl.stdio[i] = fd
		fds = append(fds, fd)
	}
	// On cgroup v1 the child moves itself into its groups (OpenTasks).
	for _, g := range []*cgroups.Group{group, workload} {
		if g == nil || g.Version() != 1 {
			continue
		}
		tasks, err := g.OpenTasks()
		if err != nil {
			closeAll()
			destroyGroup(group)
			return nil, &SetupError{Step: "join cgroup", Err: err}
		}
		fds = append(fds, tasks...)
		pl.cgTasks = append(pl.cgTasks, tasks...)
	}
	pl.cgSelf[0] = '0'
	var syncP, errP [2]int
	if err := unix.Pipe2(syncP[:], unix.O_CLOEXEC); err != nil {
		closeAll()
		destroyGroup(group)
		return nil, fmt.Errorf("pipe: %w", err)
	}
	if err := unix.Pipe2(errP[:], unix.O_CLOEXEC); err != nil {
		unix.Close(syncP[0])
		unix.Close(syncP[1])
		closeAll()
		destroyGroup(group)
		return nil, fmt.Errorf("pipe: %w", err)
	}
	pl.syncFd, pl.syncWrFd, pl.errFd = syncP[0], syncP[1], errP[1]
	lsP := [2]int{-1, -1}
	if len(cfg.Listen) > 0 {
		if err := planListeners(pl, cfg.Listen); err != nil {
			unix.Close(syncP[0])
			unix.Close(syncP[1])
			unix.Close(errP[0])
			unix.Close(errP[1])
			closeAll()
			destroyGroup(group)
			return nil, err
		}
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			unix.Close(syncP[0])
			unix.Close(syncP[1])
			unix.Close(errP[0])
			unix.Close(errP[1])
			closeAll()
			destroyGroup(group)
			return nil, fmt.Errorf("socketpair: %w", err)
		}
		lsP = fds
		pl.listenFd = lsP[1]
	}

	syscall.ForkLock.Lock()
	pid, errno := forkAs(ids, pl)
	syscall.ForkLock.Unlock()
	// The parent's copies of the child's ends.
	unix.Close(syncP[0])
	unix.Close(errP[1])
	closeAll()
	if errno != 0 {
		unix.Close(syncP[1])
		unix.Close(errP[0])
		for _, fd := range lsP {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		destroyGroup(group)
		if errno == syscall.EPERM || errno == syscall.ENOSPC || errno == syscall.EINVAL {
			return nil, &SetupError{Step: "clone into new namespaces (user namespaces disabled?)", Err: errno}
		}
		return nil, &SetupError{Step: "clone", Err: errno}
	}
	// A pidfd: signals never hit a recycled pid. The child cannot be
	// reaped before we open it: we are its parent and nobody else waits.
	pidfd, perr := unix.PidfdOpen(pid, 0)
	if perr != nil {
		unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, waitAll, nil)
		unix.Close(syncP[1])
		unix.Close(errP[0])
		for _, fd := range lsP {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		destroyGroup(group)
		return nil, &SetupError{Step: "pidfd_open", Err: perr}
	}
	s := &Sandbox{ID: id, Pid: pid, pidfd: pidfd, group: group, split: split, enforced: enforced, waitDone: make(chan struct{}), detached: detached}
	register(s)

	fail := func(step string, err error) (*Sandbox, error) {
		s.closeListeners()
		for _, fd := range lsP {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		unix.Close(syncP[1])
		s.Kill()
		s.Wait()
		// A child that failed first (joining its cgroup, say) names the
		// cause; the parent's own error is only its consequence.
		var buf [8]byte
		if n, _ := readFull(errP[0], buf[:]); n == len(buf) {
			step = stageName(binary.NativeEndian.Uint32(buf[0:]), tree)
			err = syscall.Errno(binary.NativeEndian.Uint32(buf[4:]))
		}
		unix.Close(errP[0])
		s.closePidfd()
		destroyGroup(group)
		return nil, &SetupError{Step: step, Err: err}
	}
	if err := ids.write(pid); err != nil {
		return fail("uid map", err)
	}
	if group != nil && len(pl.cgTasks) == 0 {
		if err := group.Add(pid); err != nil {
			return fail("join cgroup", err)
		}
	}
	if workload != nil {
		// The whole agent starts in the workload's group; once it names its
		// spawning thread, ReserveAgent moves every other thread out.
		if len(pl.cgTasks) == 0 {
			if err := workload.Add(pid); err != nil {
				return fail("join the workload cgroup", err)
			}
		}
		s.workload = workload
	}
	if _, err := unix.Write(syncP[1], []byte{1}); err != nil {
		return fail("release child", err)
	}
	if lsP[0] >= 0 {
		unix.Close(lsP[1]) // the child has its copy
		lsP[1] = -1
		s.listeners, err = recvListeners(lsP[0], len(pl.listenAddrs))
		unix.Close(lsP[0])
		lsP[0] = -1
		if err != nil && !errors.Is(err, errNoListeners) {
			return fail("listeners", err)
		}
		// errNoListeners: the child failed before sending them; its error
		// follows on the error pipe.
	}
	unix.Close(syncP[1])
	s.Started = time.Now()
	var buf [8]byte
	n, _ := readFull(errP[0], buf[:])
	unix.Close(errP[0])
	startDetach()
	runtime.KeepAlive(pl)
	runtime.KeepAlive(filter)
	if n == 0 {
		leaseKept = keepLease(s, lease, cfg.SurviveParent)
		return s, nil // exec succeeded
	}
	ce := childError{stage: binary.NativeEndian.Uint32(buf[0:]), errno: binary.NativeEndian.Uint32(buf[4:])}
	s.closeListeners()
	s.Wait()
	s.closePidfd()
	destroyGroup(group)
	e := syscall.Errno(ce.errno)
	if ce.stage == stageExec {
		switch e {
		case syscall.ENOENT, syscall.ENOTDIR:
			return nil, fmt.Errorf("%s: %w", cfg.Args[0], ErrNotFound)
		case syscall.EACCES, syscall.ENOEXEC, syscall.EISDIR:
			return nil, fmt.Errorf("%s: %w (%v)", cfg.Args[0], ErrNotExecutable, e)
		}
	}
	return nil, &SetupError{Step: stageName(ce.stage, tree), Err: e}
}

func readFull(fd int, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Read(fd, b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || m == 0 {
			return n, err
		}
		n += m
	}
	return n, nil
}

func stageName(st uint32, t *treeBuilder) string {
	switch {
	case st >= stageRemount && int(st-stageRemount) < len(t.rsteps):
		return t.rsteps[st-stageRemount]
	case st >= stageOp && int(st-stageOp) < len(t.steps):
		return t.steps[st-stageOp]
	}
	names := map[uint32]string{stageSync: "wait for parent", stageCgroupNS: "cgroup namespace", stageSetsid: "setsid",
		stagePrivate: "make mounts private", stagePivot: "pivot_root", stageHostname: "sethostname", stageRlimit: "rlimits",
		stageSecurebits: "securebits", stageCapBound: "drop bounding capabilities", stageSetgroups: "setgroups",
		stageSetgid: "setgid", stageSetuid: "setuid", stageCapset: "capset", stageAmbient: "clear ambient capabilities",
		stagePdeath: "parent-death signal", stageNoNewPrivs: "no_new_privs", stageLandlock: "landlock",
		stageDup: "stdio", stageCloseRange: "close descriptors", stageChdir: "chdir to workdir",
		stageSeccomp: "seccomp", stageExec: "execve", stageLoopback: "bring up loopback", stageListen: "open listeners", stageOOMScore: "oom_score_adj", stageAmbientRaise: "raise the agent's ambient capabilities",
		stageCgroupJoin: "join cgroup", stageCtty: "controlling terminal", stageNSLimits: "limit namespaces (max_*_namespaces)",
		stageLeafFd: "hand over the workload cgroup leaf"}
	if n, ok := names[st]; ok {
		return n
	}
	return fmt.Sprintf("stage %d", st)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func orUnknown(s string) string { return orDefault(s, "unknown reason") }

// prepareWorkspace makes a host workspace directory usable by the sandbox
// user: a missing directory is created for it; an existing one owned by
// another uid is ID-mapped by attachHostDirs when airlock is root, and must
// already be owned by the sandbox's host uid otherwise (airlock never
// chowns a user's files).
func prepareWorkspace(dir string, ids idMap) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create workspace: %w", err)
		}
		if err := os.Lchown(dir, ids.hostUID, ids.hostGID); err != nil {
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
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != ids.hostUID && ids.owner <= 0 { // as root, attachHostDirs maps the owner
		return fmt.Errorf("workspace %s is owned by uid %d but the sandbox user is host uid %d: chown -R %d:%d %s, or pass a directory that does not exist yet",
			dir, st.Uid, ids.hostUID, ids.hostUID, ids.hostGID, dir)
	}
	return nil
}

// Wait waits for the sandbox's init process to exit. Everything else in the
// sandbox is killed by the kernel when it does. A sandbox task that stops
// under the launcher's tracing (PTRACE_TRACEME) gets the sandbox killed,
// and the wait goes on until the init is reaped. Safe to call many times.
func (s *Sandbox) Wait() (*ExitState, error) {
	s.mu.Lock()
	if !s.waited {
		s.waited = true
		s.mu.Unlock()
		st, err := s.waitInit()
		if s.detached != nil {
			<-s.detached
		}
		unregister(s)
		s.mu.Lock()
		s.state, s.waitErr = st, err
		close(s.waitDone)
	} else {
		s.mu.Unlock()
		<-s.waitDone
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	return s.state, s.waitErr
}

// Traced reports whether the sandbox was killed because one of its tasks
// made the launcher its tracer.
func (s *Sandbox) Traced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.traced
}

// Listeners returns the listeners opened inside the sandbox's network
// namespace for Config.Listen, in order. The caller serves and closes them.
func (s *Sandbox) Listeners() []net.Listener { return s.listeners }

func (s *Sandbox) closeListeners() {
	for _, l := range s.listeners {
		l.Close()
	}
}

// Done is closed when Wait has returned.
func (s *Sandbox) Done() <-chan struct{} { return s.waitDone }

// Kill kills every process of the sandbox: SIGKILL to the init (the
// kernel kills the rest of its pid namespace) and to its cgroup. Traced
// threads of the init are then reaped until the init is.
func (s *Sandbox) Kill() {
	s.mu.Lock()
	if s.pidfd >= 0 {
		_ = unix.PidfdSendSignal(s.pidfd, unix.SIGKILL, nil, 0)
	}
	start := !s.killing && !s.waitedDone()
	s.killing = true
	s.mu.Unlock()
	if start {
		// Before the cgroup kill, which waits for the tasks to be gone.
		go s.reapAfterKill()
	}
	if s.group != nil {
		_ = s.group.Kill()
	}
}

// waitedDone reports whether the init has been reaped.
func (s *Sandbox) waitedDone() bool {
	select {
	case <-s.waitDone:
		return true
	default:
		return false
	}
}

// closePidfd releases the init's pidfd once it has been reaped.
func (s *Sandbox) closePidfd() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pidfd >= 0 {
		unix.Close(s.pidfd)
		s.pidfd = -1
	}
}

// Stats returns the sandbox's cgroup accounting.
func (s *Sandbox) Stats() (cgroups.Stats, error) {
	if s.group == nil {
		return cgroups.Stats{}, errors.New("no cgroup: accounting unavailable")
	}
	return s.group.Stats() // with the workload child's OOM kills
}

// Enforced lists the isolation layers applied to this sandbox.
func (s *Sandbox) Enforced() rt.Enforced { return s.enforced }

// Destroy kills the sandbox, reaps it and removes its cgroup. Idempotent.
func (s *Sandbox) Destroy() error {
	var err error
	s.destroy.Do(func() {
		s.closeListeners()
		s.Kill()
		s.Wait()
		s.closePidfd()
		if s.group != nil {
			err = s.group.Destroy()
		}
	})
	return err
}

func destroyGroup(g *cgroups.Group) {
	if g != nil {
		_ = g.Destroy()
	}
}

// rootCapMask is RootCaps as a bit mask.
func rootCapMask() uint64 {
	var m uint64
	for _, c := range RootCaps {
		m |= 1 << c
	}
	return m
}

// capsLayer describes the workload's capabilities.
func capsLayer(root bool) rt.Layer {
	if !root {
		return rt.Layer{Name: "capabilities", State: rt.StateOK, Detail: "all dropped (effective, permitted, inheritable, bounding, ambient); securebits noroot locked"}
	}
	return rt.Layer{Name: "capabilities", State: rt.StateOK, Detail: "root of the sandbox's user namespace: chown, dac_override, dac_read_search, fowner, setgid, setuid, net_bind_service, " +
		"acting only on ids that namespace maps (never host root); every other capability dropped; securebits noroot locked; set*id to the agent's uid refused"}
}
