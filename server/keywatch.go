package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/store"
)

// keyRecheck is how often a request that is still running (a terminal, an
// event stream, an MCP stream, a relayed WebSocket) checks that its key
// still authenticates. A revocation through this server cuts its requests
// at once (cutKey); one made elsewhere (the CLI on the state directory,
// another server on a shared database) within keyRecheck.
const keyRecheck = 2 * time.Second

// errKeyRevoked is the cause of a request cut because its key was revoked.
var errKeyRevoked = errors.New("the request's API key was revoked")

// keyRequests are the running requests of each key, to cut them when the
// key is revoked.
type keyRequests struct {
	mu   sync.Mutex
	byID map[string]map[*keyWatch]struct{}
}

// keyWatch is one running request's cancel and re-check timer.
type keyWatch struct {
	cancel  context.CancelCauseFunc
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

// watchKey returns r's context, cancelled when the key (id, secret) is
// revoked while r runs, and a stop to call when r ends. Only a refusal of
// the key cuts r: a key store that cannot be reached (a shared database
// down) leaves running requests alone, while new ones are refused.
func (s *Server) watchKey(ctx context.Context, id, secret string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &keyWatch{cancel: cancel}
	kr := &s.keyReqs
	kr.mu.Lock()
	if kr.byID == nil {
		kr.byID = map[string]map[*keyWatch]struct{}{}
	}
	if kr.byID[id] == nil {
		kr.byID[id] = map[*keyWatch]struct{}{}
	}
	kr.byID[id][w] = struct{}{}
	kr.mu.Unlock()
	w.mu.Lock()
	w.timer = time.AfterFunc(keyRecheck, func() {
		if _, err := s.cfg.Store.Authenticate(ctx, secret); errors.Is(err, store.ErrUnauthorized) {
			cancel(errKeyRevoked)
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if !w.stopped && ctx.Err() == nil {
			w.timer.Reset(keyRecheck)
		}
	})
	w.mu.Unlock()
	return ctx, func() {
		w.mu.Lock()
		w.stopped = true
		w.timer.Stop()
		w.mu.Unlock()
		cancel(nil)
		kr.mu.Lock()
		delete(kr.byID[id], w)
		if len(kr.byID[id]) == 0 {
			delete(kr.byID, id)
		}
		kr.mu.Unlock()
	}
}

// cutKey cancels every running request of key id (just revoked).
func (s *Server) cutKey(id string) {
	kr := &s.keyReqs
	kr.mu.Lock()
	defer kr.mu.Unlock()
	for w := range kr.byID[id] {
		w.cancel(errKeyRevoked)
	}
}
