package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"airlock/agent"
	"airlock/policy"
	rt "airlock/runtime"
	"airlock/runtime/gvisor"
	"airlock/runtime/native"
	"airlock/runtime/native/cgroups"
	"airlock/store"
)

// runtimeState is what the store keeps to find a sandbox again after a
// restart: its init's host pid and that process's start time (clock ticks
// since boot, /proc/PID/stat field 22), which together identify it even
// if the pid is reused.
type runtimeState struct {
	Runtime   string `json:"runtime"`
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	Socket    string `json:"socket"`
	// Enforced is what the runtime reported at start.
	Enforced rt.Enforced `json:"enforced,omitempty"`
	// Secrets names the sandbox's injected headers (never their values),
	// so that a reattached sandbox can report them lost.
	Secrets []SecretRef `json:"secrets,omitempty"`
}

// connectedMode starts agents on a connected socketpair instead of a
// listening socket. Such sandboxes cannot be reattached after a restart.
var connectedMode = false

// procStartTime returns field 22 of /proc/pid/stat.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces and parentheses: split after
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return 0, errors.New("short stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// startedSandbox is a sandbox of either runtime (*native.Sandbox,
// *gvisor.Sandbox) as this process holds it.
type startedSandbox interface {
	Done() <-chan struct{}
	Stats() (cgroups.Stats, error)
	Enforced() rt.Enforced
	Destroy() error
}

// ownInst is a sandbox this process started (and so can reap).
type ownInst struct {
	id   string
	p    int
	sb   startedSandbox
	wait func()
	once sync.Once
}

func (n *ownInst) pid() int { return n.p }
func (n *ownInst) done() <-chan struct{} {
	n.once.Do(func() { go n.wait() })
	return n.sb.Done()
}
func (n *ownInst) stats() (cgroups.Stats, error) { return n.sb.Stats() }
func (n *ownInst) destroy() error {
	if err := n.sb.Destroy(); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", n.id, err)
	}
	return nil
}

// launch starts the agent under the policy's runtime. A gVisor sandbox
// always gets its agent on a connected socketpair (stdin): gVisor cannot
// accept on a listening socket donated by the host.
func (m *Manager) launch(cfg native.Config) (*ownInst, []net.Listener, error) {
	if cfg.Policy.Runtime == policy.RuntimeGVisor {
		// runsc outlives the server, so that a crash mid pause does not
		// kill the sandbox before its checkpoint is written (pause_linux.go).
		// A running one ends anyway: its agent reads the end of the
		// socketpair the server held, and recovery removes the rest.
		cfg.SurviveParent = true
		gsb, err := gvisor.Start(cfg)
		if err != nil {
			return nil, nil, err
		}
		h := newGVisorHandle(gsb)
		return &ownInst{id: gsb.ID, p: gsb.Pid, sb: h, wait: func() { <-h.Done() }}, gsb.Listeners(), nil
	}
	if cfg.Policy.Runtime == policy.RuntimeWasm {
		cfg.Policy.Runtime = policy.RuntimeNative // it hosts the modules: see Sandbox.ExecArgv
	}
	nsb, err := native.Start(cfg)
	if err != nil {
		return nil, nil, err
	}
	return &ownInst{id: nsb.ID, p: nsb.Pid, sb: nsb, wait: func() { nsb.Wait() }}, nsb.Listeners(), nil
}

// adoptedInst is a sandbox started by a previous server process and
// reattached: it is known by a pidfd, and its cgroup by name.
type adoptedInst struct {
	id     string
	p      int
	pidfd  int
	exited chan struct{}
	once   sync.Once
	err    error
}

func adopt(id string, pid int, start uint64) (*adoptedInst, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	// Verify after opening: the pidfd now pins this exact process.
	if st, err := procStartTime(pid); err != nil || st != start {
		unix.Close(fd)
		return nil, fmt.Errorf("pid %d is no longer the sandbox's init", pid)
	}
	a := &adoptedInst{id: id, p: pid, pidfd: fd, exited: make(chan struct{})}
	go func() {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, -1)
			if err == unix.EINTR || (err == nil && n == 0) {
				continue
			}
			break
		}
		close(a.exited)
	}()
	return a, nil
}

func (a *adoptedInst) pid() int              { return a.p }
func (a *adoptedInst) done() <-chan struct{} { return a.exited }
func (a *adoptedInst) stats() (cgroups.Stats, error) {
	return readStats(a.id)
}
func (a *adoptedInst) destroy() error {
	a.once.Do(func() {
		unix.PidfdSendSignal(a.pidfd, unix.SIGKILL, nil, 0)
		select {
		case <-a.exited:
		case <-time.After(10 * time.Second):
		}
		_, a.err = destroyCgroup(a.id)
		// Unblock the poller if it is still waiting, then release the fd.
		unix.Close(a.pidfd)
	})
	return a.err
}

// destroyCgroup kills what is in the named airlock cgroup and removes it.
func destroyCgroup(id string) ([]string, error) {
	return cgroups.CleanupStale(func(name string) bool { return name != id })
}

// readStats reads the accounting of the sandbox's cgroup, named after
// its id, as the live instance's Group.Stats does: on a hybrid host the
// v2 line of /proc/PID/cgroup must not be read as if v2 were mounted at
// /sys/fs/cgroup.
func readStats(id string) (cgroups.Stats, error) {
	g, err := cgroups.Lookup(id)
	if err != nil {
		return cgroups.Stats{}, err
	}
	return g.Stats()
}

// sockPath is where the agent of sandbox id listens.
func (m *Manager) sockPath(id string) string { return filepath.Join(m.dir, id, "agent.sock") }

// start builds the sandbox: state dir, store record, listening socket,
// native sandbox running the agent, connection.
func (m *Manager) start(ctx context.Context, req *CreateRequest, p policy.Policy, ttl time.Duration) (*Sandbox, error) {
	id := native.NewID()
	dir := filepath.Join(m.dir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("manager: create sandbox dir: %w", err)
	}
	sock := m.sockPath(id)
	if len(sock) > maxSocketPath {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("manager: socket path %s too long (state dir too deep)", sock)
	}
	ns, err := m.netPrepare(id, dir, req, &p)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	pol, _ := json.Marshal(p)
	rec := store.Sandbox{ID: id, Owner: req.Owner, Profile: string(p.Profile), State: store.StateRunning,
		CreatedAt: time.Now().UTC(), ExpiresAt: time.Now().Add(ttl).UTC(), Metadata: req.Metadata,
		Policy: pol, Cgroup: id}
	ids, err := m.leaseIDs(ctx)
	if err != nil {
		m.egress.RemoveSandbox(id)
		os.RemoveAll(dir)
		return nil, err
	}
	rec.UIDBase = ids.base()
	// Recorded before anything exists on the host, so that a crash at any
	// later point leaves a record recovery can clean up after.
	if err := m.st.PutSandbox(ctx, &rec); err != nil {
		ids.Release()
		m.egress.RemoveSandbox(id)
		os.RemoveAll(dir)
		return nil, fmt.Errorf("manager: record sandbox: %w", err)
	}
	fail := func(err error) (*Sandbox, error) {
		ids.Release() // the sandbox's processes are gone by now
		m.egress.RemoveSandbox(id)
		removeSandboxDir(dir)
		m.st.EndSandbox(context.Background(), id, store.StateKilled, "create failed: "+err.Error(), time.Time{})
		return nil, err
	}
	logf, err := agentLog(filepath.Join(dir, "agent.log"))
	if err != nil {
		return fail(err)
	}
	defer logf.Close()

	var stdin, hostEnd *os.File
	connected := connectedMode || p.Runtime == policy.RuntimeGVisor
	if connected {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("manager: socketpair: %w", err))
		}
		hostEnd, stdin = os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "agent")
		defer stdin.Close()
	} else {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			return fail(fmt.Errorf("manager: agent socket: %w", err))
		}
		ln.SetUnlinkOnClose(false)
		if err := os.Chmod(sock, 0o600); err != nil {
			ln.Close()
			return fail(fmt.Errorf("manager: chmod agent socket: %w", err))
		}
		stdin, err = ln.File()
		ln.Close() // the sandbox holds the listening socket from now on
		if err != nil {
			return fail(fmt.Errorf("manager: agent socket fd: %w", err))
		}
		defer stdin.Close()
	}
	args := []string{native.AgentPath, "__agent"}
	if !connected {
		args = append(args, "--grace", m.cfg.AgentGrace.String())
	}
	args = append(args, "--user", fmt.Sprintf("%d:%d", p.User.UID, p.User.GID))
	if p.User.Root {
		args = append(args, "--root-caps="+native.RootCapsArg())
	}
	root, err := m.imageRoot(id, dir, req.image)
	if err != nil {
		return fail(err)
	}
	vols, err := m.useVolumes(id, dir, req.Volumes)
	if err != nil {
		return fail(err)
	}
	launch := m.launch
	if req.snap != nil {
		launch = func(cfg native.Config) (*ownInst, []net.Listener, error) { return m.launchFork(cfg, req.snap.image) }
	}
	inst, listeners, err := launch(native.Config{ID: id, Policy: p, Args: args, Stdin: stdin, Stdout: logf, Stderr: logf, Agent: true,
		AgentBinary: m.agentBinary(&p), AllowDegraded: m.cfg.AllowDegraded, SurviveParent: !connected, Listen: ns.listen,
		HostIDBase: ids.base(), Image: root, Volumes: vols})
	if err != nil {
		if hostEnd != nil {
			hostEnd.Close()
		}
		return fail(fmt.Errorf("manager: start sandbox: %w", err))
	}
	stdin.Close()
	if err := ids.handTo(inst.p); err != nil {
		inst.destroy()
		return fail(err)
	}
	var conn net.Conn
	if connected {
		conn, err = net.FileConn(hostEnd)
		hostEnd.Close()
		if h, ok := inst.sb.(*gvisorHandle); ok && err == nil {
			conn = h.wrap(conn) // survives checkpoint and restore
		}
	} else {
		conn, err = dialAgent(ctx, sock)
	}
	var client *agent.Client
	switch {
	case err == nil && req.snap != nil:
		// The fork's agent is in the middle of the snapshotted session.
		client = agent.ContinueClient(conn, agent.Config{Home: "/workspace"})
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err = client.Ping(pctx); err != nil {
			client.Close()
		}
		cancel()
	case err == nil:
		client, err = agent.NewClientConfig(conn, agent.Config{Home: "/workspace"})
	}
	if err != nil {
		inst.destroy()
		return fail(fmt.Errorf("manager: connect to agent: %w", err))
	}
	// The agent's threads leave the workload's cgroup (native runtime,
	// cgroup v1); fail closed if they cannot.
	if r, ok := inst.sb.(interface{ ReserveAgent(int) error }); ok {
		if err := r.ReserveAgent(client.SpawnerTid()); err != nil {
			client.Close()
			inst.destroy()
			return fail(fmt.Errorf("manager: %w", err))
		}
	}
	startTime, _ := procStartTime(inst.p)
	rs, _ := json.Marshal(runtimeState{Runtime: string(orNative(p.Runtime)), Pid: inst.p, StartTime: startTime, Socket: sock, Enforced: inst.sb.Enforced(), Secrets: ns.refs})
	rec.InitPID, rec.Runtime = inst.p, rs
	if err := m.st.PutSandbox(ctx, &rec); err != nil {
		client.Close()
		inst.destroy()
		return fail(fmt.Errorf("manager: record sandbox: %w", err))
	}
	sb := &Sandbox{ID: id, m: m, inst: inst, client: client, enforced: inst.sb.Enforced(), ended: make(chan struct{}), rec: rec}
	m.netStart(sb, p.Network, ns, listeners)
	return sb, nil
}

func orNative(r policy.Runtime) policy.Runtime {
	if r == "" {
		return policy.RuntimeNative
	}
	return r
}

// dialAgent connects to an agent's listening socket.
func dialAgent(ctx context.Context, sock string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("dial agent: %w", err)
	}
	return c, nil
}

// recover handles the sandboxes a previous server process left in the
// store as running: reattach to those whose agent answers, kill what
// remains of the others and record them lost. Then remove cgroups and
// state directories of sandboxes of this state dir that are not running.
// Last, what it left beside its sandboxes (reclaimLeftovers).
func (m *Manager) recover(ctx context.Context) error {
	defer m.reclaimLeftovers()
	recs, err := m.st.ListSandboxes(ctx, store.ListFilter{States: []string{store.StateRunning}})
	if err != nil {
		return fmt.Errorf("list running sandboxes: %w", err)
	}
	for _, rec := range recs {
		sb, why := m.reattach(ctx, rec)
		if sb != nil {
			m.live[sb.ID] = sb
			m.perOwner[rec.Owner]++
			m.loadSnapshots(sb)
			go m.watch(sb)
			m.count(func(c *Counters) { c.Reattached++ })
			m.cfg.Logf("sandbox %s: reattached", rec.ID)
			m.Audit(ctx, "", rec.ID, "sandbox.reattach", nil)
			continue
		}
		m.cfg.Logf("sandbox %s: lost: %s", rec.ID, why)
		m.killRemains(rec)
		if err := m.st.EndSandbox(ctx, rec.ID, store.StateLost, why, time.Time{}); err != nil && !errors.Is(err, store.ErrEnded) {
			return fmt.Errorf("record sandbox %s lost: %w", rec.ID, err)
		}
		m.count(func(c *Counters) { c.Lost++ })
		m.Audit(ctx, "", rec.ID, "sandbox.lost", map[string]string{"reason": why})
	}
	// Cgroups named after sandboxes of this state dir that are not live.
	// Cgroups of other servers (unknown ids) are left alone.
	if _, err := cgroups.CleanupStale(func(name string) bool {
		if m.live[name] != nil {
			return true
		}
		_, err := m.st.GetSandbox(ctx, name)
		return err != nil // unknown here: not ours
	}); err != nil {
		m.cfg.Logf("recovery: cgroup cleanup: %v", err)
	}
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", m.dir, err)
	}
	for _, e := range ents {
		if m.live[e.Name()] == nil {
			if err := removeSandboxDir(filepath.Join(m.dir, e.Name())); err != nil {
				return fmt.Errorf("remove stale state dir: %w", err)
			}
		}
	}
	return nil
}

// reattach tries to take over a sandbox a previous server started.
func (m *Manager) reattach(ctx context.Context, rec *store.Sandbox) (*Sandbox, string) {
	var rs runtimeState
	if len(rec.Runtime) == 0 || json.Unmarshal(rec.Runtime, &rs) != nil || rs.Pid <= 0 {
		return nil, "server crashed before the sandbox was started"
	}
	if rs.Runtime == string(policy.RuntimeGVisor) {
		return m.adoptPausedGVisor(rec, &rs)
	}
	inst, err := adopt(rec.ID, rs.Pid, rs.StartTime)
	if err != nil {
		return nil, "sandbox init is gone: " + err.Error()
	}
	if err := reclaimIDs(rec.UIDBase, rs.Pid); err != nil {
		inst.destroy()
		return nil, err.Error()
	}
	// A sandbox paused when the previous server stopped is thawed: a
	// paused state is not carried across a restart.
	_ = freeze(rec.ID, false)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := dialAgent(cctx, m.sockPath(rec.ID))
	var client *agent.Client
	if err == nil {
		client, err = agent.NewClientConfig(conn, agent.Config{Home: "/workspace", HelloTimeout: 5 * time.Second})
	}
	if err == nil {
		if err = client.Ping(cctx); err != nil {
			client.Close()
		}
	}
	if err != nil {
		inst.destroy()
		return nil, "agent does not answer: " + err.Error()
	}
	sb := &Sandbox{ID: rec.ID, m: m, inst: inst, client: client, reattached: true, enforced: rs.Enforced,
		ended: make(chan struct{}), rec: *rec}
	m.netReattach(sb, rs.Secrets)
	return sb, ""
}

// killRemains kills the init of a lost sandbox if it is still the process
// recorded, removes its cgroup and its state directory.
func (m *Manager) killRemains(rec *store.Sandbox) {
	var rs runtimeState
	if json.Unmarshal(rec.Runtime, &rs) == nil && rs.Pid > 0 {
		if fd, err := unix.PidfdOpen(rs.Pid, 0); err == nil {
			if st, err := procStartTime(rs.Pid); err == nil && st == rs.StartTime {
				unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
				// Gone before recovery reaps dead holders' uid leases
				// (reclaimLeftovers): readable once it has exited.
				unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 5000)
			}
			unix.Close(fd)
		}
	}
	// runsc's state and the cgroups runsc made; also of a gvisor sandbox
	// whose start the crash interrupted before its runtime was recorded.
	if _, err := os.Stat(filepath.Join(gvisor.StateBase, "bundles", rec.ID)); rs.Runtime == string(policy.RuntimeGVisor) || err == nil {
		gvisor.Remove(rec.ID)
	}
	if _, err := destroyCgroup(rec.ID); err != nil {
		m.cfg.Logf("sandbox %s: remove cgroup: %v", rec.ID, err)
	}
	removeSandboxDir(filepath.Join(m.dir, rec.ID))
}

// diskUsage asks the agent for statfs of /workspace by running stat -f
// inside the sandbox: the host never resolves a sandbox path.
func diskUsage(ctx context.Context, c *agent.Client) (used, total int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"stat", "-f", "-c", "%S %b %f", "/workspace"}, Tag: "airlock-metrics"})
	if err != nil {
		return 0, 0, fmt.Errorf("statfs via agent: %w", err)
	}
	defer p.Close()
	out, _, _, st, err := p.Collect(ctx, 256)
	if err != nil || st.Code != 0 {
		return 0, 0, fmt.Errorf("statfs via agent: exit %d: %v", st.Code, err)
	}
	var bsize, blocks, free int64
	if _, err := fmt.Sscan(string(out), &bsize, &blocks, &free); err != nil {
		return 0, 0, fmt.Errorf("statfs via agent: %q: %w", out, err)
	}
	return (blocks - free) * bsize, blocks * bsize, nil
}
