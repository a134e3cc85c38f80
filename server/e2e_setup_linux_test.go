package server_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// e2e is a running `airlock serve` on a fresh state directory, with one
// API key, a client for it and a context bounding the test.
type e2e struct {
	state, key string
	s          *srv
	c          *client.Client
	ctx        context.Context
}

// newE2E starts the server (serveArgs are extra `airlock serve` flags)
// after creating a key named name.
func newE2E(t *testing.T, name string, serveArgs ...string) *e2e {
	t.Helper()
	needRoot(t)
	e := &e2e{state: stateDir(t)}
	e.key = newKey(t, e.state, name)
	e.s = startServer(t, e.state, serveArgs...)
	e.c = client.New(e.s.URL, e.key)
	e.ctx = ctxT(t)
	return e
}

// sandbox creates a sandbox with a 10-minute TTL.
func (e *e2e) sandbox(t *testing.T, req client.CreateRequest) *client.Sandbox {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = 600
	}
	sb, err := e.c.Create(e.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// refusedServe runs `airlock serve` on state, which must refuse to start,
// and returns what it printed. A server that starts instead is stopped
// after 30 seconds and fails t.
func refusedServe(t *testing.T, state string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, airlockBin(t), "serve", "--listen", "127.0.0.1:0", "--state-dir", state).CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("airlock serve on %s started (%v): %s", state, err, out)
	}
	return string(out)
}
