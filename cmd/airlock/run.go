package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/airlock-dev/airlock/cmd/airlock/internal/runcli"
	"github.com/airlock-dev/airlock/policy"
)

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
	var rf runcli.Flags
	rf.Register(fs)
	var nf netFlags
	nf.register(fs)
	var imgf runImageFlags
	imgf.register(fs)
	codeFlag := fs.String("code", "", "run this code cell (see --language) instead of a command: the code itself, - to read it from stdin, or @FILE to read it from a source file such as @analysis.py; prints its output and the value of its last expression, and saves figures to cell-1-N.png in the current directory (with --json they are in its results, base64)")
	langFlag := fs.String("language", "python", "language of --code: python, javascript or bash")
	applyMicroVM := microvmFlags(fs)
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
	if bool(rf.Policy.TTY) && (rf.JSON || *codeFlag != "") {
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
	p, err := rf.Policy.Policy()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %s\n", oneLine(err))
		return exitUsage
	}
	if err := applyMicroVM(); err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %s\n", oneLine(err))
		return exitUsage
	}
	if p.Runtime, err = selectRuntime(rf.Runtime); err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: --runtime: %s\n", oneLine(err))
		return exitUsage
	}
	if p.Runtime == policy.RuntimeWasm && (*codeFlag != "" || imgf.ref != "") {
		fmt.Fprintln(os.Stderr, "airlock run: --runtime wasm runs a WASI module file (-- MODULE.wasm ARGS); --code and --image are not available with it")
		return exitUsage
	}
	cfg, opts := rf.Config(p, argv)
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
	rn, err := nf.setupRunNet(&cfg.Policy, &cfg, &opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %s\n", oneLine(err))
		return exitUsage
	}
	releaseImage, err := imgf.apply(ctx, &cfg, rf.Policy.Env())
	if err != nil {
		rn.close()
		fmt.Fprintf(os.Stderr, "airlock run: --image: %s\n", oneLine(err))
		return exitSetup
	}
	defer releaseImage()
	if *codeFlag != "" {
		code := runCodeCell(ctx, cfg, opts, *codeFlag, *langFlag, rf.JSON)
		rn.close()
		return code
	}
	return rf.Finish(ctx, cfg, opts, runSandbox, runTerminal, rn.close)
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

// Shared with the early path of airlock run (package runcli).
var (
	exitCodeFor      = runcli.ExitCodeFor
	oneLine          = runcli.OneLine
	isTerminal       = runcli.IsTerminal
	interruptContext = runcli.InterruptContext
	interrupted      = runcli.Interrupted
	limitDefault     = runcli.LimitDefault
	formatSize       = runcli.FormatSize
	durationText     = runcli.DurationText
)

type (
	listFlag = runcli.ListFlag
	ttyFlag  = runcli.TTYFlag
	sizeFlag = runcli.SizeFlag
)
