package server_test

import (
	"context"
	"testing"

	"airlock/client"
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
