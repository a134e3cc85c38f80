package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
	"github.com/airlock-dev/airlock/store"
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
	// Env: the sandbox has an image root or volumes (files on the host,
	// outside a memory snapshot).
	Env bool `json:"env,omitempty"`
	// Vols: the sandbox has volumes.
	Vols bool `json:"volumes,omitempty"`
	// Secrets names the sandbox's injected headers (never their values),
	// so that a reattached sandbox can report them lost.
	Secrets []SecretRef `json:"secrets,omitempty"`
}

// connectedMode starts agents on a connected socketpair instead of a
// listening socket. Such sandboxes cannot be reattached after a restart.
var connectedMode = false

// sockPath is where the agent of sandbox id listens.
func (m *Manager) sockPath(id string) string { return filepath.Join(m.dir, id, "agent.sock") }

// start builds the sandbox: state dir, store record, listening socket,
// native sandbox running the agent, connection.
func (m *Manager) start(ctx context.Context, req *CreateRequest, p policy.Policy, ttl time.Duration) (_ *Sandbox, err error) {
	id := native.NewID()
	dir := filepath.Join(m.dir, id)
	logged := false // by fail, with the agent's log
	defer func() {
		if err != nil && !logged {
			m.cfg.Logf("sandbox %s: create failed: %v", id, err)
		}
	}()
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
		m.cfg.Logf("sandbox %s: create failed: %v%s", id, err, agentLogTail(filepath.Join(dir, "agent.log")))
		logged = true
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

	t, err := tierOf(p.Runtime)
	if err != nil {
		return fail(err)
	}
	caps := t.Caps()
	var stdin, hostEnd *os.File
	connected := connectedMode || caps.ConnectedAgent
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
	if !connected || caps.AdoptRunning { // a reconnectable agent waits for the server too
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
	if req.snap != nil && root != nil && !hasRootDisk(req.snap.image) {
		// A fork of an image sandbox: the snapshot's root layers, its own
		// upper directory (snaproot.go).
		if root.Above, err = forkLayers(req.snap.image, dir); err != nil {
			return fail(err)
		}
	}
	vols, err := m.useVolumes(id, dir, req.Owner, req.Volumes)
	if err != nil {
		return fail(err)
	}
	cfg := native.Config{ID: id, Policy: p, Args: args, Stdin: stdin, Stdout: logf, Stderr: logf, Agent: true,
		AgentBinary: m.agentBinary(&p), AllowDegraded: m.cfg.AllowDegraded, SurviveParent: !connected || caps.AdoptRunning, Listen: ns.listen,
		HostIDBase: ids.base(), Image: root, Volumes: vols}
	if t.Name() != policy.RuntimeNative {
		release, err := m.starts.enter(ctx, string(t.Name()))
		if err != nil {
			return fail(fmt.Errorf("manager: waiting to start a %s sandbox: %w", t.Name(), err))
		}
		defer release() // once its agent answered (or the create failed)
	}
	var inst tier.Instance
	var listeners []net.Listener
	if req.snap != nil {
		f, ok := t.(tier.Forker)
		if !ok {
			err = refuse(t, "a fork of a memory snapshot", "memory_snapshot")
		} else {
			inst, listeners, err = f.Fork(cfg, req.snap.image)
		}
	} else {
		inst, listeners, err = t.Start(cfg)
	}
	if err != nil {
		if hostEnd != nil {
			hostEnd.Close()
		}
		return fail(fmt.Errorf("manager: start sandbox: %w", err))
	}
	stdin.Close()
	if err := ids.handTo(inst); err != nil {
		inst.Destroy()
		return fail(err)
	}
	var conn net.Conn
	if connected {
		conn, err = net.FileConn(hostEnd)
		hostEnd.Close()
		if c, ok := inst.(tier.Checkpointer); ok && err == nil {
			conn = c.WrapConn(conn) // survives checkpoint and restore
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
		hello := time.Duration(0) // the client's default
		if t.Name() != policy.RuntimeNative {
			hello = bootHelloTimeout
		}
		client, err = agent.NewClientConfig(conn, agent.Config{Home: "/workspace", HelloTimeout: hello})
	}
	if err != nil {
		inst.Destroy()
		return fail(fmt.Errorf("manager: connect to agent: %w", err))
	}
	// The agent's threads leave the workload's cgroup (native runtime,
	// cgroup v1); fail closed if they cannot.
	if r, ok := inst.(tier.AgentReserver); ok {
		if err := r.ReserveAgent(client.SpawnerTid()); err != nil {
			client.Close()
			inst.Destroy()
			return fail(fmt.Errorf("manager: %w", err))
		}
	}
	startTime, _ := native.ProcStartTime(inst.Pid())
	rs, _ := json.Marshal(runtimeState{Runtime: string(t.Name()), Pid: inst.Pid(), StartTime: startTime, Socket: sock, Enforced: inst.Enforced(), Secrets: ns.refs,
		Env: root != nil || len(vols) > 0, Vols: len(vols) > 0})
	rec.InitPID, rec.Runtime = inst.Pid(), rs
	if err := m.st.PutSandbox(ctx, &rec); err != nil {
		client.Close()
		inst.Destroy()
		return fail(fmt.Errorf("manager: record sandbox: %w", err))
	}
	sb := &Sandbox{ID: id, m: m, inst: inst, client: client, enforced: inst.Enforced(), ended: make(chan struct{}), rec: rec}
	m.netStart(sb, p.Network, ns, listeners)
	return sb, nil
}

// bootHelloTimeout bounds the first hello of an agent on a tier that boots
// a kernel of its own (gVisor's sentry, a microVM's guest; the tiers the
// start gate bounds): the hello comes at the end of that boot, which on a
// loaded two-core host (50 gVisor creates at load 35-100) can take longer
// than the 10 seconds the client gives a native agent.
const bootHelloTimeout = 30 * time.Second

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

// reattach tries to take over a sandbox a previous server started, through
// its tier's Adopter: a running one if the tier declares AdoptRunning, a
// paused one (its checkpoint complete) if it pauses by checkpoint.
func (m *Manager) reattach(ctx context.Context, rec *store.Sandbox) (*Sandbox, string) {
	var rs runtimeState
	if len(rec.Runtime) == 0 || json.Unmarshal(rec.Runtime, &rs) != nil || rs.Pid <= 0 {
		return nil, "server crashed before the sandbox was started"
	}
	t, err := tier.Lookup(policy.Runtime(rs.Runtime))
	if err != nil {
		return nil, err.Error()
	}
	ad, ok := t.(tier.Adopter)
	if !ok {
		return nil, fmt.Sprintf("runtime %s does not take over sandboxes after a restart", t.Name())
	}
	paused := false
	if t.Caps().Pause == tier.PauseCheckpoint {
		var why string
		if paused, why = m.settleCheckpoint(t, rec.ID); why != "" {
			return nil, why
		}
	}
	inst, err := ad.Adopt(tier.AdoptInfo{ID: rec.ID, Pid: rs.Pid, StartTime: rs.StartTime, Enforced: rs.Enforced,
		Paused: paused, Listen: []string{ProxyHTTPAddr, ProxySOCKSAddr}})
	if err != nil {
		return nil, err.Error()
	}
	if ck, ok := inst.(tier.Checkpointer); ok && paused {
		// Its range stays its own while it is paused too (tier.LeaseHolder).
		if err := reclaimIDs(rec.UIDBase, inst); err != nil {
			inst.Destroy()
			return nil, err.Error()
		}
		return m.adoptSuspended(rec, &rs, inst, ck), ""
	}
	if !t.Caps().AdoptRunning {
		inst.Destroy()
		return nil, fmt.Sprintf("runtime %s does not take over running sandboxes after a restart", t.Name())
	}
	if err := reclaimIDs(rec.UIDBase, inst); err != nil {
		inst.Destroy()
		return nil, err.Error()
	}
	// A sandbox paused when the previous server stopped is thawed: a
	// paused state is not carried across a restart.
	_ = freeze(rec.ID, false)
	cctx, cancel := context.WithTimeout(ctx, reattachWait)
	defer cancel()
	var conn net.Conn
	if d, ok := inst.(tier.AgentDialer); ok {
		conn, err = d.DialAgent(cctx)
	} else {
		conn, err = dialAgent(cctx, m.sockPath(rec.ID))
	}
	var client *agent.Client
	if err == nil {
		client, err = agent.NewClientConfig(conn, agent.Config{Home: "/workspace", HelloTimeout: reattachWait})
	}
	if err == nil {
		if err = client.Ping(cctx); err != nil {
			client.Close()
		}
	}
	if err != nil {
		inst.Destroy()
		return nil, "agent does not answer: " + err.Error()
	}
	sb := &Sandbox{ID: rec.ID, m: m, inst: inst, client: client, reattached: true, enforced: rs.Enforced,
		ended: make(chan struct{}), rec: *rec}
	m.netReattach(sb, rs.Secrets)
	return sb, ""
}

// reattachWait bounds the hello and first ping of a sandbox taken over
// running (a microVM's, emulated on a loaded host, answers in seconds).
const reattachWait = 30 * time.Second

// adoptSuspended takes over a sandbox that a previous server paused by
// checkpoint and did not resume: it comes back paused, and Resume restores
// it, where a client continues the agent's session without a hello
// (agent.ContinueClient) on the connection the instance holds.
func (m *Manager) adoptSuspended(rec *store.Sandbox, rs *runtimeState, inst tier.Instance, ck tier.Checkpointer) *Sandbox {
	client := agent.ContinueClient(ck.Conn(), agent.Config{Home: "/workspace"})
	sb := &Sandbox{ID: rec.ID, m: m, inst: inst, client: client, reattached: true, enforced: rs.Enforced,
		ended: make(chan struct{}), rec: *rec, paused: true}
	m.netReattach(sb, rs.Secrets)
	if l, ok := inst.(tier.Listening); ok && sb.net.listeners == nil {
		for _, l := range l.Listeners() { // not served: the sandbox has no network
			l.Close()
		}
	}
	return sb
}

// killRemains kills the init of a lost sandbox if it is still the process
// recorded, removes its cgroup and its state directory.
func (m *Manager) killRemains(rec *store.Sandbox) {
	var rs runtimeState
	if json.Unmarshal(rec.Runtime, &rs) == nil && rs.Pid > 0 {
		if fd, err := unix.PidfdOpen(rs.Pid, 0); err == nil {
			if st, err := native.ProcStartTime(rs.Pid); err == nil && st == rs.StartTime {
				unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
				// Gone before recovery reaps dead holders' uid leases
				// (reclaimLeftovers): readable once it has exited.
				unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 5000)
			}
			unix.Close(fd)
		}
	}
	// What the tier keeps on the host (runsc's state and the cgroups runsc
	// made); if the crash came before the runtime was recorded, what any
	// tier may have left (each Remove is idempotent).
	names := []policy.Runtime{policy.Runtime(rs.Runtime)}
	if rs.Runtime == "" {
		names = tier.Names()
	}
	for _, n := range names {
		if t, err := tier.Lookup(n); err == nil {
			t.Remove(rec.ID)
		}
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

// destroyCgroup kills what is in the named airlock cgroup and removes it.
func destroyCgroup(id string) ([]string, error) {
	return cgroups.CleanupStale(func(name string) bool { return name != id })
}
