package runcli

import (
	"flag"
	"io"
	"os"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// Go initialises the packages of a binary one at a time, each after the
// packages it imports, and among those ready the first by import path
// (the language specification's order). This package imports only what a
// native one-shot run needs, so its init runs before most of what the
// airlock binary links (the server, the store's SQLite, MCP, esbuild,
// wazero, BuildKit's parser, protobuf registrations); GODEBUG=inittrace=1
// shows the order. When the command line is `airlock run` of a plain
// native sandbox, init runs it and exits: the rest of the binary is never
// initialised. Anything else returns untouched to package main, which
// parses the same flags again and handles every case (docs/cli.md).
func init() {
	if len(os.Args) < 2 || os.Args[1] != "run" {
		return
	}
	// Not on this goroutine: during init it is locked to the main thread,
	// so that every wake-up of it in the run (a pipe read, the wait for
	// the sandbox's end) would be a hand-over between threads.
	type outcome struct {
		code int
		ok   bool
	}
	done := make(chan outcome)
	go func() {
		code, ok := runEarly(os.Args[2:])
		done <- outcome{code, ok}
	}()
	if o := <-done; o.ok {
		os.Exit(o.code)
	}
}

// runEarly runs `airlock run ARGS` when ARGS need nothing beyond this
// package: the policy flags, --json and -i, --runtime native, and a
// command. It reports false, having changed nothing, for anything else
// (the network, image, code-cell and microVM flags, another tier, -t,
// --help, a bad flag or policy, no command): package main then runs the
// whole command as it always has, errors and their messages included.
// The sandbox is the same either way: the same policy from the same flags,
// started by the same native.Run.
func runEarly(args []string) (int, bool) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f Flags
	f.Register(fs)
	if fs.Parse(args) != nil || f.Runtime != string(policy.RuntimeNative) || bool(f.Policy.TTY) || fs.NArg() == 0 {
		return 0, false
	}
	p, err := f.Policy.Policy()
	if err != nil {
		return 0, false
	}
	p.Runtime = policy.RuntimeNative
	ctx, stop, caught := InterruptContext()
	defer stop()
	cfg, opts := f.Config(p, fs.Args())
	code := f.Finish(ctx, cfg, opts, native.Run, nil, nil)
	if s := caught(); s != nil {
		return Interrupted("airlock run", "the sandbox was stopped and removed", s), true
	}
	return code, true
}
