package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/template"
)

const templateUsage = `usage:
  airlock template build -f Dockerfile -t NAME [--build-arg K=V]... [--net allow:HOST,...] [--runtime native|gvisor] [--no-cache] [--state-dir DIR] [CONTEXT]

Builds an image from a Dockerfile into DIR/images (the store 'airlock image'
and 'airlock run --image' use): FROM an image (pulled if missing), RUN in an
airlock sandbox made from the image so far (strict profile; under --runtime,
default native; network only as
--net gives it, through the egress proxy as for airlock run),
COPY/ADD of files from CONTEXT (default: the Dockerfile's directory), ENV,
LABEL, ARG, WORKDIR, USER, SHELL, EXPOSE, CMD, ENTRYPOINT, with BuildKit's
parser and semantics. COPY/ADD into /tmp, /workspace, /dev or /proc is
refused (every sandbox mounts its own there); a RUN using /tmp, /workspace
or /dev/shm gets a warning (what it writes there is not kept). Every step is
cached; the build log goes to stderr and the image's name and digest to
stdout; 'airlock run --image NAME' runs its ENTRYPOINT and CMD. Needs root.
`

func init() { hidden["template"] = cmdTemplate }

func cmdTemplate(args []string) int {
	if len(args) == 0 || args[0] != "build" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Print(templateUsage)
			return 0
		}
		fmt.Fprint(os.Stderr, templateUsage)
		return exitUsage
	}
	fs := flag.NewFlagSet("template build", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	file := fs.String("f", "", "the Dockerfile (default CONTEXT/Dockerfile)")
	name := fs.String("t", "", "name of the image to build (required)")
	stateDir := fs.String("state-dir", defaultStateDir(), "state directory; images are in DIR/images")
	noCache := fs.Bool("no-cache", false, "run every step again")
	runtimeName := fs.String("runtime", "native", "the tier RUN steps run under: native or gvisor")
	var buildArgs listFlag
	fs.Var(&buildArgs, "build-arg", "KEY=VALUE for an ARG (repeatable)")
	var nf netFlags // RUN steps' network, as for airlock run (default none)
	nf.register(fs)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(templateUsage)
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock template build: %v\n%s", suggestFlag(fs, err), templateUsage)
		return exitUsage
	}
	if *name == "" || fs.NArg() > 1 {
		fmt.Fprintf(os.Stderr, "airlock template build: -t NAME and at most one CONTEXT\n%s", templateUsage)
		return exitUsage
	}
	ctxDir := fs.Arg(0)
	if ctxDir == "" {
		ctxDir = "."
		if *file != "" {
			ctxDir = filepath.Dir(*file)
		}
	}
	if *file == "" {
		*file = filepath.Join(ctxDir, "Dockerfile")
	}
	bargs := map[string]string{}
	for _, kv := range buildArgs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			fmt.Fprintf(os.Stderr, "airlock template build: --build-arg %q: want KEY=VALUE\n", kv)
			return exitUsage
		}
		bargs[k] = v
	}
	st, err := openImages(*stateDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock template build: %v\n", err)
		return 1
	}
	p, err := policy.Preset(policy.Strict)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock template build: %v\n", err)
		return 1
	}
	if p.Runtime, err = selectRuntime(*runtimeName); err != nil {
		fmt.Fprintf(os.Stderr, "airlock template build: --runtime: %v\n", err)
		return exitUsage
	}
	ctx, stop, caught := interruptContext()
	defer stop()
	res, err := template.Build(ctx, template.Options{Dockerfile: *file, Context: ctxDir, Name: *name, Store: st,
		StateDir: *stateDir, Policy: p, Args: bargs, NoCache: *noCache, Log: os.Stderr,
		Prepare: func(p *policy.Policy, cfg *native.Config, opts *native.RunOptions) (func(), error) {
			rn, err := nf.setupRunNet(p, cfg, opts)
			if err != nil {
				return nil, err
			}
			return rn.close, nil
		}})
	if s := caught(); s != nil {
		return interrupted("airlock template build", "the build was stopped (its steps so far are cached)", s)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock template build: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "built in %d steps, %d cached\n", res.Steps, res.Cached)
	fmt.Printf("%s %s\n", res.Image.Name, res.Image.Digest)
	return 0
}
