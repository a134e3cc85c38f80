package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/term"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// runTerminal prepares airlock run -t: a fresh pseudo-terminal pair whose
// slave the sandbox gets as stdin, stdout, stderr and controlling terminal
// (setsid + TIOCSCTTY inside), while this process copies between the
// caller's terminal, put in raw mode, and the master, and passes window
// size changes on (SIGWINCH). The sandbox never holds the caller's own
// terminal, so TIOCSTI and friends can only type into its own. The
// returned function restores the caller's terminal and releases the rest.
func runTerminal(cfg *native.Config, opts *native.RunOptions) (restore func(), err error) {
	if cfg.Policy.Runtime != "" && cfg.Policy.Runtime != policy.RuntimeNative && cfg.Policy.Runtime != policy.RuntimeMicroVM {
		return nil, fmt.Errorf("-t works with the native and microvm runtimes only, not %s", cfg.Policy.Runtime)
	}
	in := int(os.Stdin.Fd())
	if !term.IsTerminal(in) {
		return nil, errors.New("-t gives the program a pseudo-terminal and needs a terminal as standard input (use -i to pipe input)")
	}
	master, slave, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("-t: opening a pseudo-terminal: %w", err)
	}
	pty.InheritSize(os.Stdin, master)
	old, err := term.MakeRaw(in)
	if err != nil {
		master.Close()
		slave.Close()
		return nil, fmt.Errorf("-t: raw mode on the terminal: %w", err)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		for range winch {
			pty.InheritSize(os.Stdin, master)
		}
	}()
	if !hasEnv(cfg.Policy.Env, "TERM") {
		t := os.Getenv("TERM")
		if t == "" || strings.ContainsAny(t, "=\x00") {
			t = "xterm-256color"
		}
		cfg.Policy.Env = append(cfg.Policy.Env, "TERM="+t)
	}
	opts.PTY = &native.PTY{Master: master, Slave: slave}
	opts.Stdin = struct{ io.Reader }{os.Stdin}
	opts.Stdout, opts.Stderr = os.Stdout, nil
	return func() {
		signal.Stop(winch)
		term.Restore(in, old)
	}, nil
}

// hasEnv reports whether env (KEY=VALUE pairs) sets key.
func hasEnv(env []string, key string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, key+"=") {
			return true
		}
	}
	return false
}
