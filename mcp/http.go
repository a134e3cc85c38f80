package mcp

import (
	"context"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Caller is who an HTTP request acts for: the owner of the sandboxes it
// creates and may use.
type Caller struct {
	// Owner is the API key ID; "" when the server runs without auth.
	Owner string
	// MaxSandboxes is the key's own cap on running sandboxes; 0 means none.
	MaxSandboxes int
}

type callerKey struct{}

// maxSandboxesKey carries Caller.MaxSandboxes in auth.TokenInfo.Extra.
const maxSandboxesKey = "airlock.max_sandboxes"

// WithCaller returns ctx carrying c, for the handler of HTTPHandler. The
// server's authentication middleware calls it after checking the bearer
// token.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// HTTPHandler serves MCP over streamable HTTP. It does not authenticate:
// mount it behind the API's authentication, which passes the caller with
// WithCaller; a request without a Caller acts for owner "" (a server
// without auth). Sessions are bound to their caller (another key's request
// for the session is refused), and end, killing their default sandbox,
// when the client deletes them or after Config.SessionTimeout without a
// request.
//
// Two answers differ from the SDK's: a request for a method the server
// does not have gets a JSON-RPC error -32601 (the SDK answers plain-text
// 400 before protocol 2026-07-28), and a request the client cancelled gets
// no response (see cancel.go).
func (s *Service) HTTPHandler() http.Handler {
	// Requests must fit a write_file of MaxWrite bytes in base64.
	maxBody := int64(s.cfg.MaxWrite)/3*4 + 1<<20
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s.srv },
		&sdk.StreamableHTTPOptions{SessionTimeout: s.cfg.SessionTimeout, MaxRequestBodyBytes: maxBody})
	var ch httpCancels
	return ch.wrap(maxBody, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(callerKey{}).(Caller)
		if c.Owner == "" {
			h.ServeHTTP(w, r)
			return
		}
		// The SDK learns the user of a request from auth.TokenInfo, which
		// only its bearer middleware can attach; the token was checked
		// already, so its verifier just vouches for the caller. The SDK
		// then refuses a session's requests from another user, and tool
		// handlers read the owner from the TokenInfo.
		verify := func(context.Context, string, *http.Request) (*auth.TokenInfo, error) {
			return &auth.TokenInfo{UserID: c.Owner, Expiration: time.Now().Add(time.Hour),
				Extra: map[string]any{maxSandboxesKey: c.MaxSandboxes}}, nil
		}
		auth.RequireBearerToken(verify, nil)(h).ServeHTTP(w, r)
	}))
}
