package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/airlock-dev/airlock/client"
)

// shellTTY is airlock shell --tty: argv (default the sandbox's login
// shell) on a pseudo-terminal of sandbox id, through the server's
// terminal WebSocket (GET /v1/sandboxes/{id}/pty). The caller's terminal
// stays on this side: it is put in raw mode (restored at the end) and only
// its bytes travel, so the sandbox never holds the caller's terminal
// (no TIOCSTI into it). Window size changes (SIGWINCH) are forwarded.
// The result is the command's exit code (128+N for a signal). cwd ""
// is the sandbox's default; name prefixes messages ("airlock shell").
func shellTTY(ctx context.Context, c *client.Client, id string, argv []string, cwd, name string) int {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGHUP)
	defer stop()
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	cols, rows := 80, 24
	if w, h, err := term.GetSize(out); err == nil && w > 0 && h > 0 {
		cols, rows = w, h
	}
	t, err := c.Terminal(ctx, id, client.TerminalRequest{Argv: argv, Cwd: cwd, Cols: cols, Rows: rows, Term: os.Getenv("TERM")})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	defer t.Close()
	if term.IsTerminal(in) {
		old, err := term.MakeRaw(in)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: raw mode on the terminal: %v\n", name, err)
			return 1
		}
		defer term.Restore(in, old)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for range winch {
			if w, h, err := term.GetSize(out); err == nil && w > 0 && h > 0 {
				t.Resize(w, h)
			}
		}
	}()
	// Input: the caller's bytes, Ctrl-C included, go to the terminal; the
	// end of the caller's input ends nothing (the command decides).
	go io.Copy(t, os.Stdin)
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(os.Stdout, t)
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		return 1
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "\r\n%s: %v\r\n", name, err)
		return 1
	}
	ex := t.Exit()
	if ex == nil {
		fmt.Fprintf(os.Stderr, "\r\n%s: the terminal ended without an exit status\r\n", name)
		return 1
	}
	if ex.Signal != "" {
		if n := unix.SignalNum(ex.Signal); n != 0 {
			return 128 + int(n)
		}
		return 1
	}
	return ex.Code
}

// errNoTTYArgs is the answer to arguments without --tty.
var errNoTTYArgs = errors.New("a command is only taken with --tty (a code session reads its cells from stdin)")
