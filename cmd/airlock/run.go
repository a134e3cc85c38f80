package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/internal/hostcheck"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// policyFlags are the flags shared by every command that builds a policy.
type policyFlags struct {
	profile, memory, disk, timeout, workdir, workspace, output string
	cpus                                                       optFloat
	pids                                                       optInt
	mounts, env                                                listFlag
	allowDegraded                                              bool
	tty                                                        ttyFlag
}

func (f *policyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.profile, "profile", "strict", "policy preset: strict, standard or light (docs/SECURITY.md has a table of what each sets)")
	fs.StringVar(&f.memory, "memory", "", "memory limit, e.g. 256M, 1G "+limitDefault("memory"))
	fs.StringVar(&f.disk, "disk", "", "size of /workspace and /tmp (each), e.g. 64M "+limitDefault("disk"))
	fs.StringVar(&f.output, "output-limit", "", "stdout+stderr bytes before the run is stopped, e.g. 1M "+limitDefault("output"))
	fs.Var(&f.cpus, "cpus", "CPU quota in cores, e.g. 0.5 "+limitDefault("cpus"))
	fs.Var(&f.pids, "pids", "maximum number of processes "+limitDefault("pids"))
	fs.StringVar(&f.timeout, "timeout", "", "wall-clock limit, e.g. 10s, 2m "+limitDefault("timeout"))
	fs.Var(&f.mounts, "mount", "bind a host path: SRC:DST[:ro|rw] (repeatable; read-only by default)")
	fs.StringVar(&f.workdir, "workdir", "", "working directory inside the sandbox (default /workspace)")
	fs.Var(&f.env, "env", "environment variable KEY=VALUE (repeatable; nothing is inherited from the host)")
	fs.StringVar(&f.workspace, "workspace", "", "host directory to bind read-write at /workspace (default: a fresh tmpfs)")
	f.registerDockerFlags(fs)
	fs.BoolVar(&f.allowDegraded, "allow-degraded", true, "run even when cgroups are unavailable to this user (limits fall back to rlimits; a warning is printed and the result says so); --allow-degraded=false refuses instead")
}

// policy turns the flags into a validated policy.
func (f *policyFlags) policy() (policy.Policy, error) {
	p, err := policy.Preset(policy.Profile(f.profile))
	if err != nil {
		return p, err
	}
	size := func(name, v string, dst *int64) error {
		if v == "" {
			return nil
		}
		n, err := policy.ParseSize(v)
		if err != nil {
			return fmt.Errorf("--%s: %w", name, err)
		}
		*dst = n
		return nil
	}
	if err := errors.Join(size("memory", f.memory, &p.Limits.MemoryBytes), size("disk", f.disk, &p.Limits.DiskBytes),
		size("output-limit", f.output, &p.Limits.OutputBytes)); err != nil {
		return p, err
	}
	if f.cpus.set {
		p.Limits.CPUs = f.cpus.v
	}
	if f.pids.set {
		p.Limits.Pids = f.pids.v
	}
	if f.timeout != "" {
		d, err := time.ParseDuration(f.timeout)
		if err != nil {
			if n, err2 := strconv.ParseFloat(f.timeout, 64); err2 == nil {
				d = time.Duration(n * float64(time.Second))
			} else {
				return p, fmt.Errorf("--timeout: bad duration %q (want e.g. 10s, 2m)", f.timeout)
			}
		}
		p.Limits.WallTime = d
	}
	for _, m := range f.mounts {
		parts := strings.Split(m, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return p, fmt.Errorf("--mount %q: want SRC:DST[:ro|rw]", m)
		}
		mnt := policy.Mount{Source: parts[0], Target: parts[1]}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
			case "rw":
				mnt.Writable = true
			default:
				return p, fmt.Errorf("--mount %q: mode must be ro or rw", m)
			}
		}
		abs, err := filepath.Abs(mnt.Source)
		if err != nil {
			return p, fmt.Errorf("--mount %q: %w", m, err)
		}
		mnt.Source = abs
		if _, err := os.Stat(abs); err != nil {
			return p, fmt.Errorf("--mount %q: source does not exist: %s", m, abs)
		}
		p.Filesystem.Mounts = append(p.Filesystem.Mounts, mnt)
	}
	for _, kv := range f.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return p, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		p.SetEnv(k, v)
	}
	if f.workdir != "" {
		p.Filesystem.Workdir = f.workdir
	}
	if f.workspace != "" {
		abs, err := filepath.Abs(f.workspace)
		if err != nil {
			return p, fmt.Errorf("--workspace: %w", err)
		}
		p.Filesystem.Workspace = abs
	}
	if err := checkHostCeilings(p.Limits); err != nil {
		return p, err
	}
	return p, p.Validate()
}

// cmdRun is airlock run. SIGINT or SIGTERM stops the sandbox, removes it
// and exits 130 or 143 with a message.
func cmdRun(args []string) int {
	ctx, stop, caught := interruptContext()
	defer stop()
	code := runCommand(ctx, args)
	if s := caught(); s != nil {
		return interrupted("airlock run", "the sandbox was stopped and removed", s)
	}
	return code
}

func runCommand(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var pf policyFlags
	pf.register(fs)
	var nf netFlags
	nf.register(fs)
	var imgf runImageFlags
	imgf.register(fs)
	asJSON := fs.Bool("json", false, "print one JSON result object instead of streaming output")
	codeFlag := fs.String("code", "", "run this code cell (see --language) instead of a command: the code itself, - to read it from stdin, or @FILE to read it from a source file such as @analysis.py; prints its output and the value of its last expression, and saves figures to cell-1-N.png in the current directory (with --json they are in its results, base64)")
	langFlag := fs.String("language", "python", "language of --code: python, javascript or bash")
	runtimeFlag := fs.String("runtime", "native", "isolation tier: native, gvisor (gVisor's user-space kernel via runsc; docs/gvisor.md) wasm (CMD is a WASI module file run in wazero; docs/wasm.md) or microvm (a QEMU guest with its own kernel; docs/microvm.md)")
	applyMicroVM := microvmFlags(fs)
	interactive := fs.Bool("i", false, "copy a terminal's input to the program (through a pipe: the sandbox never gets the terminal itself)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fmt.Print(runUsage)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock run: %v\n", suggestFlag(fs, err))
		return exitUsage
	}
	if bool(pf.tty) && (*asJSON || *codeFlag != "") {
		fmt.Fprintln(os.Stderr, "airlock run: -t gives an interactive program a terminal; it does not go with --json or --code")
		return exitUsage
	}
	argv := fs.Args()
	if *codeFlag != "" {
		code, err := readCode(*codeFlag)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock run: --code: %v\n", err)
			return exitUsage
		}
		*codeFlag = code
	}
	if len(argv) == 0 && *codeFlag == "" && imgf.ref == "" {
		fmt.Fprintln(os.Stderr, "airlock run: missing command (usage: airlock run [flags] -- CMD [ARGS...]; with --image the image's ENTRYPOINT and CMD are the default)")
		return exitUsage
	}
	imgf.defaultCommand = len(argv) == 0 && *codeFlag == ""
	p, err := pf.policy()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %s\n", oneLine(err))
		return exitUsage
	}
	if err := applyMicroVM(); err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %s\n", oneLine(err))
		return exitUsage
	}
	if p.Runtime, err = selectRuntime(*runtimeFlag); err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: --runtime: %s\n", oneLine(err))
		return exitUsage
	}
	if p.Runtime == policy.RuntimeWasm && (*codeFlag != "" || imgf.ref != "") {
		fmt.Fprintln(os.Stderr, "airlock run: --runtime wasm runs a WASI module file (-- MODULE.wasm ARGS); --code and --image are not available with it")
		return exitUsage
	}
	cfg := native.Config{Policy: p, Args: argv, AllowDegraded: pf.allowDegraded}
	if p.Runtime == policy.RuntimeMicroVM {
		// The guest's initramfs carries its agent: the agent-only build
		// beside this binary when it checks out (a quarter of the bytes for
		// the guest to unpack), else this binary, as serve chooses.
		if self, err := os.Executable(); err == nil {
			if lean, _ := leanAgent(self, "", func(string, ...any) {}); lean != "" {
				cfg.AgentBinary = lean
			}
		}
	}
	opts := native.RunOptions{Stdin: os.Stdin, Capture: *asJSON}
	if isTerminal(os.Stdin) {
		// Never hand the caller's terminal to the sandbox (TIOCSTI and
		// friends): copy it through a pipe, and only when asked to.
		opts.Stdin = nil
		if *interactive {
			opts.Stdin = struct{ io.Reader }{os.Stdin}
		}
	}
	if !*asJSON {
		opts.Stdout, opts.Stderr = os.Stdout, os.Stderr
	} else {
		opts.Stdin = nil
	}
	rn, err := nf.setupRunNet(&cfg.Policy, &cfg, &opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %s\n", oneLine(err))
		return exitUsage
	}
	releaseImage, err := imgf.apply(ctx, &cfg, pf.env)
	if err != nil {
		rn.close()
		fmt.Fprintf(os.Stderr, "airlock run: --image: %s\n", oneLine(err))
		return exitSetup
	}
	defer releaseImage()
	if *codeFlag != "" {
		code := runCodeCell(ctx, cfg, opts, *codeFlag, *langFlag, *asJSON)
		rn.close()
		return code
	}
	// Off the critical path: remove cgroups left by launchers that crashed,
	// on the other core while this run's sandbox works.
	swept := make(chan struct{})
	go func() {
		if p.Runtime != policy.RuntimeWasm { // no cgroups: nothing to sweep
			_, _ = native.CleanupOrphans()
		}
		close(swept)
	}()
	restore := func() {}
	if bool(pf.tty) {
		if restore, err = runTerminal(&cfg, &opts); err != nil {
			rn.close()
			<-swept
			fmt.Fprintf(os.Stderr, "airlock run: %s\n", oneLine(err))
			return exitUsage
		}
	}
	res, err := runSandbox(ctx, cfg, opts)
	restore()
	rn.close()
	<-swept
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
	}
	if err != nil {
		if !*asJSON {
			fmt.Fprintf(os.Stderr, "airlock run: %s\n", explainStart(err))
		}
		return exitCodeFor(res)
	}
	if !*asJSON {
		for _, l := range res.Enforced {
			if l.State != "ok" {
				fmt.Fprintf(os.Stderr, "airlock: WARNING: %s %s: %s\n", l.Name, l.State, l.Detail)
				if l.Name == "cgroup" {
					fmt.Fprintf(os.Stderr, "airlock: fix: %s\n", hostcheck.CgroupFix())
				}
			}
		}
		switch res.Status {
		case native.StatusTimeout:
			fmt.Fprintf(os.Stderr, "airlock: timeout: killed after %s\n", p.Limits.WallTime)
		case native.StatusOOM:
			fmt.Fprintf(os.Stderr, "airlock: oom: killed at the %d-byte memory limit\n", p.Limits.MemoryBytes)
		case native.StatusOutputLimit:
			fmt.Fprintf(os.Stderr, "airlock: output_limit: stopped after %d bytes of output\n", p.Limits.OutputBytes)
		}
	}
	return exitCodeFor(res)
}

const runUsage = `usage:
  airlock run [flags] -- CMD [ARGS...]
  airlock run [flags] --image REF [-- CMD [ARGS...]]
  airlock run [flags] --code CODE|-|@FILE [--language python|javascript|bash]

Runs one command (or one code cell) in a fresh sandbox that is removed when
it ends. With --image and no command it runs the image's ENTRYPOINT and CMD
(as docker run does); a command given replaces both. Ctrl-C (SIGINT) or
SIGTERM stops and removes the sandbox and exits 130 or 143.
Limits left unset take the profile's value, shown as "default" below.
Docker spellings work too: -e, -v, -w, -i, --rm.
`

// readCode resolves --code's value: "-" reads stdin, "@FILE" reads a file,
// anything else is the code itself.
func readCode(v string) (string, error) {
	var b []byte
	var err error
	switch {
	case v == "-":
		b, err = io.ReadAll(io.LimitReader(os.Stdin, maxCodeBytes+1))
		if err != nil {
			return "", fmt.Errorf("reading stdin: %w", err)
		}
	case strings.HasPrefix(v, "@"):
		f, err := os.Open(v[1:])
		if err != nil {
			return "", err
		}
		defer f.Close()
		if b, err = io.ReadAll(io.LimitReader(f, maxCodeBytes+1)); err != nil {
			return "", fmt.Errorf("reading %s: %w", v[1:], err)
		}
	default:
		return v, nil
	}
	if len(b) > maxCodeBytes {
		return "", fmt.Errorf("the code is larger than %d bytes", maxCodeBytes)
	}
	if len(b) == 0 {
		return "", errors.New("the code is empty")
	}
	return string(b), nil
}

// maxCodeBytes is what __cell reads from its stdin.
const maxCodeBytes = 16 << 20

func exitCodeFor(r *native.Result) int {
	if r == nil { // refused before any sandbox existed
		return exitSetup
	}
	switch r.Status {
	case native.StatusOK, native.StatusNonzeroExit, native.StatusKilled, native.StatusOOM:
		return r.ExitCode
	case native.StatusTimeout:
		return exitTimeout
	case native.StatusOutputLimit:
		return exitOutput
	}
	if r.ExitCode == 126 || r.ExitCode == 127 {
		return r.ExitCode
	}
	return exitSetup
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// explainStart renders a failure to start a sandbox with what on this host
// forbids it and the fix (hostcheck), one finding per line; other errors on
// one line.
func explainStart(err error) string {
	var he *hostcheck.Error
	if err = hostcheck.Explain(err); errors.As(err, &he) {
		return he.Error()
	}
	return oneLine(err)
}

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
