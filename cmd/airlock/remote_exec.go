package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
	"unicode/utf8"

	"github.com/airlock-dev/airlock/client"
)

const execUsage = `usage: airlock exec [-i] [-t|-it] [-e KEY=VALUE]... [-w DIR] [--timeout D] SANDBOX CMD [ARGS...]

Runs CMD in a running sandbox of the server and exits with its code
(128+N when signal N killed it). Output streams as it comes. -i streams
this command's stdin to CMD as it comes (text: the API carries UTF-8;
'airlock cp - SANDBOX:PATH' moves bytes). -t (or -it)
runs CMD on a pseudo-terminal of the sandbox instead (this terminal goes
raw, its size follows). Ctrl-C or SIGTERM kills CMD and exits 130 or 143.
Without --timeout CMD may run as long as the sandbox lives.
Exit codes of airlock itself: 125 bad usage, 124 --timeout passed,
126/127 CMD not executable / not found, 1 the server refused or is
unreachable.
`

// cmdExec is airlock exec.
func cmdExec(args []string) int {
	r := newRemote("exec", execUsage)
	r.cmdStart = 2 // SANDBOX CMD: what follows CMD is its own
	interactive := r.fs.Bool("i", false, "stream stdin to CMD as it comes (UTF-8 text)")
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
	id, argv := r.arg(0), r.pos[1:]
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
		return execInteractive(ctx, r, c, id, req, caught)
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

// stdinChunk bounds one write of -i's input.
const stdinChunk = 64 << 10

// execInteractive is exec -i: CMD starts in the background with its stdin
// open, this command's stdin is written to it as it comes (closed at its
// end) and its output followed until it exits. The API carries stdin as
// text, so input that is not UTF-8 stops the command with an error rather
// than arriving altered. Ctrl-C, SIGTERM and --timeout kill CMD.
func execInteractive(ctx context.Context, r *remote, c *client.Client, id string, req client.ExecRequest, caught func() os.Signal) int {
	limit := req.TimeLimit
	req.TimeLimit, req.StdinOpen = 0, true
	pid, err := c.Start(ctx, id, req)
	if err != nil {
		return r.fail(err, caught)
	}
	kill := func() { c.Signal(context.Background(), id, pid, "KILL") }
	st, err := c.Attach(ctx, id, pid)
	if err != nil {
		kill()
		return r.fail(err, caught)
	}
	defer st.Close()
	pumpErr := make(chan error, 1)
	go func() { pumpErr <- pumpStdin(ctx, c, id, pid) }()
	timedOut := make(chan struct{})
	if limit > 0 {
		t := time.AfterFunc(limit, func() { close(timedOut); kill() })
		defer t.Stop()
	}
	type result struct {
		ev  client.Event
		err error
	}
	done := make(chan result, 1)
	go func() { ev, err := relay(st); done <- result{ev, err} }()
	for {
		select {
		case err := <-pumpErr:
			if errors.Is(err, errStdinNotText) {
				kill()
				<-done
				fmt.Fprintf(os.Stderr, "airlock exec: stdin: %v; the command was killed\n", err)
				return exitRemote
			}
			// Stdin is over, or the command stopped reading it (exited:
			// its exit follows, as a shell ignores a broken pipe).
			pumpErr = nil
		case res := <-done:
			select {
			case <-timedOut:
				fmt.Fprintf(os.Stderr, "airlock exec: killed after --timeout %s\n", durationText(limit))
				return exitTimeout
			default:
			}
			if res.err != nil {
				kill()
				if s := caught(); s != nil {
					return interrupted("airlock exec", "the command was killed", s)
				}
				return r.fail(res.err, nil)
			}
			if res.ev.Type == "error" {
				fmt.Fprintf(os.Stderr, "airlock exec: %s\n", res.ev.Data)
				return exitRemote
			}
			return execExitCode(res.ev, limit)
		}
	}
}

// errStdinNotText stops exec -i on input the API cannot carry unaltered.
var errStdinNotText = errors.New("not UTF-8 text (the API carries stdin as text: copy bytes in with 'airlock cp - SANDBOX:PATH')")

// pumpStdin writes this command's stdin to process pid in UTF-8 chunks
// (a character split between two reads goes whole into the next) and
// closes it at the end of the input.
func pumpStdin(ctx context.Context, c *client.Client, id string, pid int) error {
	buf := make([]byte, stdinChunk)
	var carry []byte
	for {
		n, err := os.Stdin.Read(buf)
		data := append(carry, buf[:n]...)
		carry = nil
		if err == nil {
			// Keep an incomplete last character for the next read.
			for i := 1; i <= utf8.UTFMax && i <= len(data); i++ {
				if utf8.RuneStart(data[len(data)-i]) {
					if !utf8.FullRune(data[len(data)-i:]) {
						carry = append([]byte(nil), data[len(data)-i:]...)
						data = data[:len(data)-i]
					}
					break
				}
			}
		}
		if !utf8.Valid(data) {
			return errStdinNotText
		}
		if len(data) > 0 {
			if werr := c.WriteStdin(ctx, id, pid, string(data), false); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return c.WriteStdin(ctx, id, pid, "", true)
		}
		if err != nil {
			return err
		}
	}
}
