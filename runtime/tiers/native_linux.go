package tiers

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
	"github.com/airlock-dev/airlock/runtime/wasm"
)

// Native is the native tier: namespaces, seccomp, Landlock, cgroups
// (package native).
type Native struct{}

// Name implements tier.Tier.
func (Native) Name() policy.Runtime { return policy.RuntimeNative }

// Available implements tier.Tier: the native tier runs on every Linux host
// airlock supports; what a host lacks is refused or reported per layer at
// start (native.Start fails closed) and by `airlock doctor`.
func (Native) Available() error { return nil }

// Caps implements tier.Tier.
func (Native) Caps() tier.Caps {
	return tier.Caps{ImageRoots: true, Volumes: true, HostDirs: true, Pause: tier.PauseFreeze, Network: true, AttachNetwork: true,
		AdoptRunning: true, Pooled: true}
}

// Start implements tier.Tier.
func (Native) Start(cfg native.Config) (tier.Instance, []net.Listener, error) {
	sb, err := native.Start(cfg)
	if err != nil {
		return nil, nil, err
	}
	return &nativeInst{Sandbox: sb}, sb.Listeners(), nil
}

// Run implements tier.Runner.
func (Native) Run(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error) {
	return native.Run(ctx, cfg, opts)
}

// Remove implements tier.Tier: a native sandbox leaves nothing but its
// cgroup, which the manager removes by name.
func (Native) Remove(string) {}

// Adopt implements tier.Adopter: the sandbox's init, still running, is
// pinned by a pidfd and checked to be the process recorded.
func (Native) Adopt(info tier.AdoptInfo) (tier.Instance, error) {
	return adopt(info)
}

// nativeInst is a native sandbox this process started. It is reaped once
// Done is first asked for.
type nativeInst struct {
	*native.Sandbox
	reap sync.Once
}

func (n *nativeInst) Pid() int { return n.Sandbox.Pid }

func (n *nativeInst) Done() <-chan struct{} {
	n.reap.Do(func() { go n.Sandbox.Wait() })
	return n.Sandbox.Done()
}

// adoptedInst is a sandbox started by a previous server process and taken
// over: known by a pidfd, and its cgroup by name.
type adoptedInst struct {
	id       string
	p        int
	pidfd    int
	enforced rt.Enforced
	exited   chan struct{}
	once     sync.Once
	err      error
}

func adopt(info tier.AdoptInfo) (*adoptedInst, error) {
	fd, err := unix.PidfdOpen(info.Pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", info.Pid, err)
	}
	// Verify after opening: the pidfd now pins this exact process.
	if st, err := native.ProcStartTime(info.Pid); err != nil || st != info.StartTime {
		unix.Close(fd)
		return nil, fmt.Errorf("pid %d is no longer the sandbox's init", info.Pid)
	}
	if native.PidfdExited(fd) {
		unix.Close(fd)
		return nil, fmt.Errorf("the sandbox's init (pid %d) has exited", info.Pid)
	}
	a := &adoptedInst{id: info.ID, p: info.Pid, pidfd: fd, enforced: info.Enforced, exited: make(chan struct{})}
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

func (a *adoptedInst) Pid() int              { return a.p }
func (a *adoptedInst) Done() <-chan struct{} { return a.exited }
func (a *adoptedInst) Enforced() rt.Enforced { return a.enforced }
func (a *adoptedInst) String() string        { return "sandbox " + a.id + " (pid " + strconv.Itoa(a.p) + ")" }
func (a *adoptedInst) OOMKills() (int64, error) {
	st, err := a.Stats()
	return st.OOMKills, err
}

// Stats reads the accounting of the sandbox's cgroup, named after its id,
// as a live sandbox's does: on a hybrid host the v2 line of /proc/PID/cgroup
// must not be read as if v2 were mounted at /sys/fs/cgroup.
func (a *adoptedInst) Stats() (cgroups.Stats, error) {
	g, err := cgroups.Lookup(a.id)
	if err != nil {
		return cgroups.Stats{}, err
	}
	return g.Stats()
}

func (a *adoptedInst) Destroy() error {
	a.once.Do(func() {
		unix.PidfdSendSignal(a.pidfd, unix.SIGKILL, nil, 0)
		select {
		case <-a.exited:
		case <-time.After(10 * time.Second):
		}
		_, a.err = cgroups.CleanupStale(func(name string) bool { return name != a.id })
		// Unblock the poller if it is still waiting, then release the fd.
		unix.Close(a.pidfd)
	})
	return a.err
}

// Wasm is the wasm tier: a native sandbox whose execs are WASI modules run
// by the in-sandbox airlock's wasm-exec (package wasm, on wazero), with the
// sandbox's memory limit as the module's linear memory cap.
type Wasm struct{ Native }

// Name implements tier.Tier.
func (Wasm) Name() policy.Runtime { return policy.RuntimeWasm }

// Caps implements tier.Tier: a native sandbox's pause and adoption; no
// image roots, volumes or pool (its agent is the whole binary).
func (Wasm) Caps() tier.Caps {
	return tier.Caps{Pause: tier.PauseFreeze, AdoptRunning: true, FullAgent: true}
}

// Start implements tier.Tier: the host sandbox is a native one, whose
// JavaScript code contexts run QuickJS for WASI in wazero (the agent's
// --quickjs-memory: `airlock wasm-kernel`) with the sandbox's memory limit.
func (w Wasm) Start(cfg native.Config) (tier.Instance, []net.Listener, error) {
	cfg.Args = append(append([]string(nil), cfg.Args...), "--quickjs-memory="+strconv.FormatInt(cfg.Policy.Limits.MemoryBytes, 10))
	cfg.Policy.Runtime = policy.RuntimeNative
	return w.Native.Start(cfg)
}

// Run implements tier.Runner: the module runs in wazero (package wasm).
func (Wasm) Run(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error) {
	return wasm.Run(ctx, cfg, opts)
}

// ExecArgv implements tier.ExecRewriter: argv (MODULE.wasm ARGS, MODULE a
// file in the sandbox) is run by wasm-exec; a shell command is refused.
func (Wasm) ExecArgv(p *policy.Policy, argv []string, shell bool) ([]string, error) {
	if shell || len(argv) == 0 {
		return nil, fmt.Errorf("a wasm sandbox runs WASI modules: give argv [\"MODULE.wasm\", ARGS...], not a shell command")
	}
	out := []string{native.AgentPath, "wasm-exec", "--memory", strconv.FormatInt(p.Limits.MemoryBytes, 10), "--"}
	return append(out, argv...), nil
}

// What the manager asks of a native sandbox beyond tier.Instance: a change
// of a method's name must not make it silently skip these.
var (
	_ tier.OOMCounter    = (*nativeInst)(nil)
	_ tier.Backgrounder  = (*nativeInst)(nil)
	_ tier.AgentReserver = (*nativeInst)(nil)
	_ tier.OOMCounter    = (*adoptedInst)(nil)
	_ tier.Adopter       = Native{}
	_ tier.Runner        = Native{}
	_ tier.Runner        = Wasm{}
)
