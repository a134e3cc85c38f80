// Package runcli is the part of `airlock run` that a one-shot native run
// needs: its flags, the policy they make, the run and the report of its
// result. Package main builds the whole command on it (adding the
// network, image, code-cell and other-tier flags), and this package's
// init runs the plain native case itself before the rest of the binary
// is initialised (early.go), so that `airlock run -- CMD` does not pay
// for the package state of the server, the store, MCP and the other
// tiers that the one binary also holds.
package runcli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/internal/hostcheck"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// Exit codes of airlock itself; a sandboxed command's own code passes through.
const (
	ExitUsage    = 125 // bad flags, bad sizes, invalid policy
	ExitSetup    = 123 // the sandbox could not be built
	ExitTimeout  = 124 // the wall-clock deadline killed the sandbox
	ExitOutput   = 122 // the output limit stopped the run
	ExitNotExec  = 126 // command found but not executable inside
	ExitNotFound = 127 // command not found inside
)

// Flags are the flags of airlock run that every run has: the policy's,
// --json, --runtime and -i. Package main adds the others.
type Flags struct {
	Policy      PolicyFlags
	JSON        bool
	Runtime     string
	Interactive bool
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	f.Policy.Register(fs)
	fs.BoolVar(&f.JSON, "json", false, "print one JSON result object instead of streaming output")
	fs.StringVar(&f.Runtime, "runtime", "native", "isolation tier: native, gvisor (gVisor's user-space kernel via runsc; docs/gvisor.md) wasm (CMD is a WASI module file run in wazero; docs/wasm.md) or microvm (a QEMU guest with its own kernel; docs/microvm.md)")
	fs.BoolVar(&f.Interactive, "i", false, "copy a terminal's input to the program (through a pipe: the sandbox never gets the terminal itself)")
}

// Config makes the sandbox's configuration and the run's streams for
// policy p and command argv: output streams to this process's, or is
// captured with --json; a terminal on stdin is never handed over.
func (f *Flags) Config(p policy.Policy, argv []string) (native.Config, native.RunOptions) {
	cfg := native.Config{Policy: p, Args: argv, AllowDegraded: f.Policy.AllowDegraded}
	opts := native.RunOptions{Stdin: os.Stdin, Capture: f.JSON}
	if IsTerminal(os.Stdin) {
		// Never hand the caller's terminal to the sandbox (TIOCSTI and
		// friends): copy it through a pipe, and only when asked to.
		opts.Stdin = nil
		if f.Interactive {
			opts.Stdin = struct{ io.Reader }{os.Stdin}
		}
	}
	if !f.JSON {
		opts.Stdout, opts.Stderr = os.Stdout, os.Stderr
	} else {
		opts.Stdin = nil
	}
	return cfg, opts
}

// Runner runs a one-shot sandbox: its tier's Run.
type Runner func(ctx context.Context, cfg native.Config, opts native.RunOptions) (*native.Result, error)

// Terminal gives the program of cfg a pseudo-terminal (-t) and returns
// what restores the caller's.
type Terminal func(cfg *native.Config, opts *native.RunOptions) (restore func(), err error)

// Finish is the end of airlock run once cfg and opts are ready: it
// removes the cgroups of crashed launchers beside the run, gives the
// program a terminal with -t (terminal), runs it with run, calls done
// (may be nil) once the sandbox is gone, and reports the result. It
// returns airlock run's exit code.
func (f *Flags) Finish(ctx context.Context, cfg native.Config, opts native.RunOptions, run Runner, terminal Terminal, done func()) int {
	if done == nil {
		done = func() {}
	}
	// Off the critical path: remove cgroups left by launchers that crashed,
	// on the other core while this run's sandbox works.
	swept := make(chan struct{})
	go func() {
		if cfg.Policy.Runtime != policy.RuntimeWasm { // no cgroups: nothing to sweep
			_, _ = native.CleanupOrphans()
		}
		close(swept)
	}()
	restore := func() {}
	if bool(f.Policy.TTY) {
		var err error
		if terminal == nil {
			err = errors.New("-t: no terminal support in this path")
		} else {
			restore, err = terminal(&cfg, &opts)
		}
		if err != nil {
			done()
			<-swept
			fmt.Fprintf(os.Stderr, "airlock run: %s\n", OneLine(err))
			return ExitUsage
		}
	}
	res, err := run(ctx, cfg, opts)
	restore()
	done()
	<-swept
	if f.JSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
	}
	if err != nil {
		if !f.JSON {
			fmt.Fprintf(os.Stderr, "airlock run: %s\n", ExplainStart(err))
		}
		return ExitCodeFor(res)
	}
	if !f.JSON {
		l := cfg.Policy.Limits
		for _, layer := range res.Enforced {
			if layer.State != "ok" {
				fmt.Fprintf(os.Stderr, "airlock: WARNING: %s %s: %s\n", layer.Name, layer.State, layer.Detail)
				if layer.Name == "cgroup" {
					fmt.Fprintf(os.Stderr, "airlock: fix: %s\n", hostcheck.CgroupFix())
				}
			}
		}
		switch res.Status {
		case native.StatusTimeout:
			fmt.Fprintf(os.Stderr, "airlock: timeout: killed after %s\n", l.WallTime)
		case native.StatusOOM:
			fmt.Fprintf(os.Stderr, "airlock: oom: killed at the %d-byte memory limit\n", l.MemoryBytes)
		case native.StatusOutputLimit:
			fmt.Fprintf(os.Stderr, "airlock: output_limit: stopped after %d bytes of output\n", l.OutputBytes)
		}
	}
	return ExitCodeFor(res)
}

// ExitCodeFor is airlock run's exit code for a result: the program's own,
// or one of airlock's (Exit*).
func ExitCodeFor(r *native.Result) int {
	if r == nil { // refused before any sandbox existed
		return ExitSetup
	}
	switch r.Status {
	case native.StatusOK, native.StatusNonzeroExit, native.StatusKilled, native.StatusOOM:
		return r.ExitCode
	case native.StatusTimeout:
		return ExitTimeout
	case native.StatusOutputLimit:
		return ExitOutput
	}
	if r.ExitCode == ExitNotExec || r.ExitCode == ExitNotFound {
		return r.ExitCode
	}
	return ExitSetup
}

// OneLine is err's text on one line.
func OneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// ExplainStart renders a failure to start a sandbox with what on this host
// forbids it and the fix (hostcheck), one finding per line; other errors on
// one line.
func ExplainStart(err error) string {
	var he *hostcheck.Error
	if err = hostcheck.Explain(err); errors.As(err, &he) {
		return he.Error()
	}
	return OneLine(err)
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
