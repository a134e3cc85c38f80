package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/cmd/airlock/internal/runcli"
	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/internal/statelock"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/mcp"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/store"
)

func init() { hidden["mcp"] = cmdMCP }

const mcpUsage = `usage: airlock mcp [flags]

Serves airlock's sandboxes as MCP tools over stdio, for MCP clients that
launch it (Claude Desktop, Cursor, VS Code...): run_command, run_code,
write_file, read_file, list_files, create_sandbox, list_sandboxes,
kill_sandbox.
Tools called without a sandbox_id share one sandbox, created on first use
and killed when stdin closes. No server is needed: the sandboxes run in
this process's own manager. Sandboxes have no network unless --net allows
it; see docs/mcp.md and docs/network.md.

Every flag can also be set in the environment variable named after it,
e.g. AIRLOCK_PROFILE=standard or AIRLOCK_SANDBOX_TIMEOUT=2h.

`

// mcpFlags are the flags of airlock mcp.
type mcpFlags struct {
	profile, memory, disk, maxOutput, stateDir string
	agentBinary                                string
	runtime                                    string
	cpus                                       float64
	pids                                       int64
	timeout, sandboxTimeout                    time.Duration
	maxSandboxes                               int
	allowDegraded                              bool
	net                                        netFlags
}

func (f *mcpFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.profile, "profile", "strict", "policy preset of the sandboxes: strict, standard or light")
	fs.StringVar(&f.runtime, "default-runtime", "native", "runtime of sandboxes created without one (the session's sandbox, create_sandbox without runtime): native or gvisor (docs/gvisor.md)")
	fs.StringVar(&f.memory, "memory", "", "memory limit of each sandbox, e.g. 256M, 1G "+limitDefault("memory"))
	fs.StringVar(&f.disk, "disk", "", "size of /workspace and /tmp (each) in each sandbox, e.g. 64M "+limitDefault("disk"))
	fs.Float64Var(&f.cpus, "cpus", 0, "CPU quota of each sandbox in cores "+limitDefault("cpus"))
	fs.Int64Var(&f.pids, "pids", 0, "maximum number of processes in each sandbox "+limitDefault("pids"))
	fs.DurationVar(&f.timeout, "timeout", mcp.DefaultCallTimeout, "time limit of one run_command or run_code call that does not ask for its own (calls may ask for up to 10m or this, whichever is larger)")
	fs.DurationVar(&f.sandboxTimeout, "sandbox-timeout", time.Hour, "a session's sandbox is killed after this long without a tool call; also the lifetime of create_sandbox sandboxes that do not ask for one")
	fs.IntVar(&f.maxSandboxes, "max-sandboxes", 10, "sandboxes running at once")
	fs.StringVar(&f.maxOutput, "max-output", "32K", "bytes of stdout and of stderr a result shows; the middle of longer output is cut")
	fs.StringVar(&f.stateDir, "state-dir", defaultMCPStateDir(), "directory for the state database and sandbox sockets; each running airlock mcp takes its own numbered subdirectory")
	f.net.register(fs)
	// The proxy's caps, as airlock serve's defaults.
	f.net.egress.maxConns, f.net.egress.maxBytes = 64, "4G"
	fs.StringVar(&f.agentBinary, "agent-binary", "", agentBinaryUsage)
	fs.BoolVar(&f.allowDegraded, "allow-degraded", true, "run even when cgroups are unavailable to this user (memory, process and CPU limits then fall back to rlimits; a warning is logged); false refuses instead")
}

// defaultMCPStateDir is a per-user directory: $XDG_STATE_HOME/airlock/mcp
// or ~/.local/state/airlock/mcp.
func defaultMCPStateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "airlock", "mcp")
	}
	if h, err := os.UserHomeDir(); err == nil && filepath.IsAbs(h) {
		return filepath.Join(h, ".local", "state", "airlock", "mcp")
	}
	return filepath.Join(os.TempDir(), "airlock-mcp-"+strconv.Itoa(os.Getuid()))
}

// envDefaults sets every flag not given on the command line from
// AIRLOCK_<FLAG> (upper case, - as _).
func envDefaults(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		key := "AIRLOCK_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(key); ok && !given[f.Name] {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", key, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// limits turns the size and count flags into manager limits.
func (f *mcpFlags) limits() (manager.Limits, error) {
	var l manager.Limits
	err := errors.Join(runcli.SizeArg("memory", f.memory, &l.MemoryBytes), runcli.SizeArg("disk", f.disk, &l.DiskBytes))
	l.CPUs, l.Pids = f.cpus, f.pids
	if f.cpus < 0 || f.pids < 0 {
		err = errors.Join(err, errors.New("--cpus and --pids must not be negative"))
	}
	return l, err
}

// cmdMCP serves MCP over stdio.
func cmdMCP(args []string) int {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f mcpFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fmt.Print(mcpUsage)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock mcp: %v\n%s", suggestFlag(fs, err), mcpUsage)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "airlock mcp: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if err := envDefaults(fs); err != nil {
		fmt.Fprintf(os.Stderr, "airlock mcp: %v\n", err)
		return exitUsage
	}
	if err := requireStaticBuild(); err != nil {
		fmt.Fprintf(os.Stderr, "airlock mcp: %v\n", err)
		return exitSetup
	}
	network, err := f.net.network()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock mcp: %v\n", oneLine(err))
		return exitUsage
	}
	var secrets []egress.Secret
	for _, v := range f.net.secrets {
		sec, err := parseSecret(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock mcp: %v\n", err)
			return exitUsage
		}
		secrets = append(secrets, sec)
	}
	if len(secrets) > 0 && network.Mode == policy.NetNone {
		fmt.Fprintln(os.Stderr, "airlock mcp: --secret needs --net allow:HOST or --net open")
		return exitUsage
	}
	egressCfg, err := f.net.egress.config()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock mcp: %v\n", err)
		return exitUsage
	}
	limits, err := f.limits()
	maxOut, err2 := policy.ParseSize(f.maxOutput)
	if err = errors.Join(err, err2); err != nil {
		fmt.Fprintf(os.Stderr, "airlock mcp: %v\n", err)
		return exitUsage
	}
	// Check the profile and limits now rather than at the first tool call.
	p, err := policy.Preset(policy.Profile(f.profile))
	if err == nil {
		for _, o := range []struct {
			dst *int64
			v   int64
		}{{&p.Limits.MemoryBytes, limits.MemoryBytes}, {&p.Limits.DiskBytes, limits.DiskBytes}, {&p.Limits.Pids, limits.Pids}} {
			if o.v != 0 {
				*o.dst = o.v
			}
		}
		if limits.CPUs != 0 {
			p.Limits.CPUs = limits.CPUs
		}
		err = p.Validate()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock mcp: %v\n", oneLine(err))
		return exitUsage
	}
	rtm, err := selectRuntime(f.runtime)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock mcp: --default-runtime: %s\n", oneLine(err))
		return exitUsage
	}
	// Everything goes to stderr: stdout carries the protocol.
	logger := log.New(os.Stderr, "airlock mcp: ", log.LstdFlags)
	egressCfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	if info := cgroups.Detect(); info.Version == 0 || info.Reason != "" {
		if !f.allowDegraded {
			logger.Printf("cgroups unavailable (%s): memory, process and CPU limits cannot be enforced; refusing to start with --allow-degraded=false", info.Reason)
			return exitSetup
		}
		logger.Printf("WARNING: cgroups unavailable (%s): memory, process and CPU limits fall back to rlimits", info.Reason)
	}
	self, err := os.Executable()
	if err != nil {
		logger.Printf("locate own binary: %v", err)
		return 1
	}
	lean, err := leanAgent(self, f.agentBinary, logger.Printf)
	if err != nil {
		logger.Printf("%v", err)
		return exitSetup
	}
	dir, unlock, err := lockStateSlot(f.stateDir)
	if err != nil {
		logger.Printf("%v", err)
		return 1
	}
	defer unlock()
	logger.Printf("state dir %s", dir)
	st, err := store.Open(dir)
	if err != nil {
		logger.Printf("%v", err)
		return 1
	}
	defer st.Close()
	m, err := manager.Open(manager.Config{StateDir: dir, Store: st, AgentBinary: self, LeanAgent: lean, MaxSandboxes: f.maxSandboxes,
		AllowDegraded: f.allowDegraded, DefaultTimeout: f.sandboxTimeout, MaxTimeout: max(24*time.Hour, f.sandboxTimeout),
		Egress: egressCfg, Logf: logger.Printf, DefaultRuntime: rtm})
	if err != nil {
		logger.Printf("%v", err)
		return 1
	}
	defer m.Close()
	svc, err := mcp.New(mcp.Config{Manager: m, Version: version, Profile: f.profile, Limits: limits,
		Network: network, Secrets: secrets,
		SandboxTimeout: f.sandboxTimeout, CallTimeout: f.timeout, MaxOutput: int(min(maxOut, 1<<30)), Logf: logger.Printf})
	if err != nil {
		logger.Printf("%v", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = svc.Run(ctx, &sdk.StdioTransport{})
	svc.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		logger.Printf("session ended: %v", err)
	}
	return 0
}

// lockStateSlot takes the first numbered subdirectory of base that no
// other airlock mcp holds, locked (flock) for this process's life. Each
// slot has its own database and sandboxes, so that concurrent servers
// never recover (kill) each other's sandboxes, while a crashed server's
// leftovers are cleaned up by the next one taking its slot.
func lockStateSlot(base string) (string, func(), error) {
	if err := os.MkdirAll(base, 0o700); err != nil {
		return "", nil, fmt.Errorf("state dir: %w", err)
	}
	for i := 0; i < 256; i++ {
		dir := filepath.Join(base, strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", nil, fmt.Errorf("state dir: %w", err)
		}
		l, err := statelock.Acquire(dir)
		if err == nil {
			return dir, l.Release, nil
		}
		var held *statelock.HeldError
		if !errors.As(err, &held) {
			return "", nil, err
		}
	}
	return "", nil, fmt.Errorf("state dir %s: 256 airlock mcp servers are running already", base)
}
