package mcp

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// The MCP specification says a request the client cancelled
// (notifications/cancelled) gets no response. The SDK cancels the tool's
// context but still writes the handler's result, so the transports here
// drop that response: Service.Run wraps its transport (dropCancelled), and
// HTTPHandler filters what it writes (see http.go).

// cancelSet tracks the requests in flight on one connection and which of
// them the client cancelled. Only in-flight requests can be cancelled, so
// the set stays as small as the work under way.
type cancelSet struct {
	mu       sync.Mutex
	inflight map[any]bool // request id (ID.Raw()) -> cancelled
}

func newCancelSet() *cancelSet { return &cancelSet{inflight: map[any]bool{}} }

// start records a request the client sent.
func (c *cancelSet) start(id any) {
	c.mu.Lock()
	c.inflight[id] = false
	c.mu.Unlock()
}

// cancel records a notifications/cancelled for an in-flight request.
func (c *cancelSet) cancel(id any) {
	c.mu.Lock()
	if _, ok := c.inflight[id]; ok {
		c.inflight[id] = true
	}
	c.mu.Unlock()
}

// finish forgets a request whose response is being written and reports
// whether the client cancelled it (the response must then be dropped).
func (c *cancelSet) finish(id any) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cancelled := c.inflight[id]
	delete(c.inflight, id)
	return cancelled
}

// cancelledID returns the request id a notifications/cancelled names.
func cancelledID(req *jsonrpc.Request) (any, bool) {
	if req.Method != "notifications/cancelled" || req.IsCall() {
		return nil, false
	}
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(req.Params, &p) != nil {
		return nil, false
	}
	id, err := jsonrpc.MakeID(p.RequestID)
	if err != nil || !id.IsValid() {
		return nil, false
	}
	return id.Raw(), true
}

// dropCancelled wraps a transport so that the server never answers a
// request the client cancelled.
type dropCancelled struct{ sdk.Transport }

// Connect implements sdk.Transport.
func (d dropCancelled) Connect(ctx context.Context) (sdk.Connection, error) {
	c, err := d.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &cancelConn{Connection: c, set: newCancelSet()}, nil
}

// cancelConn is a Connection that drops responses to cancelled requests.
type cancelConn struct {
	sdk.Connection
	set *cancelSet
}

// Read implements sdk.Connection.
func (c *cancelConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if req, ok := m.(*jsonrpc.Request); ok {
		if req.IsCall() {
			c.set.start(req.ID.Raw())
		} else if id, ok := cancelledID(req); ok {
			c.set.cancel(id)
		}
	}
	return m, err
}

// Write implements sdk.Connection.
func (c *cancelConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if resp, ok := m.(*jsonrpc.Response); ok && c.set.finish(resp.ID.Raw()) {
		return nil
	}
	return c.Connection.Write(ctx, m)
}
