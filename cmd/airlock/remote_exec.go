package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"airlock/client"
)

const execUsage = `usage: airlock exec [-i] [-t|-it] [-e KEY=VALUE]... [-w DIR] [--timeout D] SANDBOX CMD [ARGS...]

Runs CMD in a running sandbox of the server and exits with its code
(128+N when signal N killed it). Output streams as it comes. -i sends
this command's stdin (at most 900 KiB; 'airlock cp' for more). -t (or -it)
runs CMD on a pseudo-terminal of the sandbox instead (this terminal goes
raw, its size follows). Ctrl-C or SIGTERM kills CMD and exits 130 or 143.
Without --timeout CMD may run as long as the sandbox lives.
Exit codes of airlock itself: 125 bad usage, 124 --timeout passed,
126/127 CMD not executable / not found, 1 the server refused or is
unreachable.
`

// maxExecStdin bounds -i's input: it travels inside the 1 MiB JSON body.
const maxExecStdin = 900 << 10

// cmdExec is airlock exec.
func cmdExec(args []string) int {
	r := newRemote("exec", execUsage)
	interactive := r.fs.Bool("i", false, "send stdin to CMD")
	var tty ttyFlag
	for _, name := range []string{"t", "it", "ti"} {
		r.fs.Var(&tty, name, "run CMD on a pseudo-terminal of the sandbox (this terminal goes raw meanwhile)")
	}
	var env listFlag
	r.fs.Var(&env, "e", "KEY=VALUE in CMD's environment (repeatable)")
	r.fs.Var(&env, "env", "same as -e")
	workdir := r.fs.String("w", "", "working directory (default /workspace)")
	limit := r.fs.Duration("timeout", 0, "kill CMD after this long (default: when the sandbox expires)")
	c, code := r.parse(args)
	if c == nil {
		return code
	}
	if !r.args(2, -1) {
		return r.usageError("name a sandbox and a command")
	}
	envm, err := keyValues("-e", env)
	if err != nil {
		return r.usageError(err.Error())
	}
	if *limit < 0 {
		return r.usageError("--timeout must be positive")
	}
	id, argv := r.fs.Arg(0), r.fs.Args()[1:]
	ctx, stop, caught := interruptContext()
	defer stop()
	if tty {
		if len(envm) > 0 || *limit != 0 {
			return r.usageError("-e and --timeout are not taken with -t (the terminal runs CMD as the login shell would)")
		}
		code := shellTTY(ctx, c, id, argv, *workdir, "airlock exec")
		if s := caught(); s != nil {
			return interrupted("airlock exec", "the command was killed", s)
		}
		return code
	}
	req := client.ExecRequest{Argv: argv, Cwd: *workdir, Env: envm, TimeLimit: *limit}
	if *interactive {
		b, err := io.ReadAll(io.LimitReader(os.Stdin, maxExecStdin+1))
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock exec: reading stdin: %v\n", err)
			return exitRemote
		}
		if len(b) > maxExecStdin {
			return r.usageError(fmt.Sprintf("-i takes at most %d KiB of stdin: copy larger input with 'airlock cp - %s:PATH'", maxExecStdin>>10, id))
		}
		req.Stdin = string(b)
	}
	if req.TimeLimit == 0 {
		// As long as the sandbox lives (the server's default is 60 s).
		sb, err := c.Get(ctx, id)
		if err != nil {
			return r.fail(err, caught)
		}
		req.TimeLimit = 24 * time.Hour
		if sb.ExpiresAt != nil {
			req.TimeLimit = max(time.Until(*sb.ExpiresAt)+time.Minute, time.Minute)
		}
	}
	st, err := c.ExecStream(ctx, id, req)
	if err != nil {
		return r.fail(err, caught)
	}
	defer st.Close()
	ev, err := relay(st)
	if err != nil {
		st.Close() // a foreground command ends with its stream
		if s := caught(); s != nil {
			return interrupted("airlock exec", "the command was killed", s)
		}
		if errors.Is(err, io.EOF) {
			err = errors.New("the server ended the stream without the command's exit")
		}
		return r.fail(err, nil)
	}
	if ev.Type == "error" {
		fmt.Fprintf(os.Stderr, "airlock exec: %s\n", ev.Data)
		return exitRemote
	}
	return execExitCode(ev, req.TimeLimit)
}

// execExitCode
func execExitCode(ev client.Event, limit time.Duration) int {
	switch ev.Status {
	case "timeout":
		fmt.Fprintf(os.Stderr, "airlock exec: killed after --timeout %s\n", durationText(limit))
		return exitTimeout
	case "not_found":
		if ev.ExitCode <= 0 {
			return exitNotFound
		}
	case "not_executable":
		if ev.ExitCode <= 0 {
			return exitNotExec
		}
	case "oom":
		fmt.Fprintln(os.Stderr, "airlock exec: the out-of-memory killer ended the command (the sandbox lives on)")
	case "error":
		fmt.Fprintln(os.Stderr, "airlock exec: the command could not be run")
		return exitRemote
	}
	if ev.ExitCode < 0 {
		return exitRemote
	}
	return ev.ExitCode
}
