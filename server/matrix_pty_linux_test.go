package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// matrixPty is the matrix's "pty" operation: a shell on a pseudo-terminal
// of sandbox id through the API (GET /v1/sandboxes/{id}/pty) echoes what
// is typed and runs it, sees its initial size and a resize with `stty
// size`, and its `exit 3` is reported as exit status 3.
func matrixPty(ctx context.Context, c *client.Client, id string) error {
	term, err := c.Terminal(ctx, id, client.TerminalRequest{Argv: []string{"sh"}, Cols: 90, Rows: 30})
	if err != nil {
		return err
	}
	defer term.Close()
	var out testserver.Output
	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(&out, term)
		ended <- err
	}()
	at := 0
	waitFor := func(want string) error {
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			s := out.String()
			if i := strings.Index(s[min(at, len(s)):], want); i >= 0 {
				at = min(at, len(s)) + i + len(want)
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pty: never saw %q; output: %q", want, s)
			}
		}
	}
	steps := []struct{ typed, want string }{
		// The terminal echoes the input; $((...)) makes the output differ.
		{"echo pty-$((40+2))\n", "echo pty-$((40+2))"},
		{"", "pty-42"},
		{"stty size\n", "30 90"},
	}
	for _, s := range steps {
		if s.typed != "" {
			if _, err := term.Write([]byte(s.typed)); err != nil {
				return err
			}
		}
		if err := waitFor(s.want); err != nil {
			return err
		}
	}
	if err := term.Resize(120, 40); err != nil {
		return err
	}
	if _, err := term.Write([]byte("stty size\n")); err != nil {
		return err
	}
	if err := waitFor("40 120"); err != nil {
		return err
	}
	if _, err := term.Write([]byte("exit 3\n")); err != nil {
		return err
	}
	select {
	case err := <-ended:
		if err != nil {
			return fmt.Errorf("pty: ended with %w, not at its end of file", err)
		}
	case <-time.After(2 * time.Minute):
		return errors.New("pty: the shell did not end after exit 3")
	}
	if x := term.Exit(); x == nil || x.Code != 3 {
		return fmt.Errorf("pty: exit %+v, want status 3", x)
	}
	return nil
}
