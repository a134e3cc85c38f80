package mcp

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// httpCancels tracks, per MCP session, the requests in flight over
// streamable HTTP and the ones their client cancelled.
type httpCancels struct {
	mu       sync.Mutex
	sessions map[string]*cancelSet
}

func (h *httpCancels) set(session string) *cancelSet {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sessions == nil {
		h.sessions = map[string]*cancelSet{}
	}
	cs := h.sessions[session]
	if cs == nil {
		cs = newCancelSet()
		h.sessions[session] = cs
	}
	return cs
}

// drop forgets a session's set once nothing is in flight in it.
func (h *httpCancels) drop(session string, cs *cancelSet) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs.mu.Lock()
	empty := len(cs.inflight) == 0
	cs.mu.Unlock()
	if empty && h.sessions[session] == cs {
		delete(h.sessions, session)
	}
}

// wrap serves next with two changes to its answers to a POSTed JSON-RPC
// message: a plain-text 400 for an unknown method becomes JSON-RPC error
// -32601, and the response to a request cancelled meanwhile is not sent.
func (h *httpCancels) wrap(maxBody int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		if err != nil || int64(len(body)) > maxBody {
			next.ServeHTTP(w, r) // the SDK answers
			return
		}
		msg, err := jsonrpc.DecodeMessage(body)
		req, ok := msg.(*jsonrpc.Request)
		if err != nil || !ok {
			next.ServeHTTP(w, r)
			return
		}
		session := r.Header.Get("Mcp-Session-Id")
		if !req.IsCall() {
			if id, ok := cancelledID(req); ok && session != "" {
				h.set(session).cancel(id)
			}
			next.ServeHTTP(w, r)
			return
		}
		rw := &rpcWriter{ResponseWriter: w, id: req.ID}
		if session != "" {
			rw.cancels = h.set(session)
			rw.cancels.start(req.ID.Raw())
			defer func() {
				rw.cancels.finish(req.ID.Raw())
				h.drop(session, rw.cancels)
			}()
		}
		next.ServeHTTP(rw, r)
		rw.end(req)
	})
}

// rpcWriter is the ResponseWriter of one POSTed JSON-RPC request.
type rpcWriter struct {
	http.ResponseWriter
	id      jsonrpc.ID
	cancels *cancelSet // nil before the session exists

	wrote   bool         // headers went to the client
	held    bool         // a 400 is held back to be looked at
	heldBuf bytes.Buffer // its body
}

// WriteHeader implements http.ResponseWriter.
func (w *rpcWriter) WriteHeader(code int) {
	if code == http.StatusBadRequest && !w.wrote && !w.held {
		w.held = true
		return
	}
	if !w.held {
		w.wrote = true
		w.ResponseWriter.WriteHeader(code)
	}
}

// Write implements http.ResponseWriter. A held 400's body is kept; the
// response to this request is dropped if the client cancelled it.
func (w *rpcWriter) Write(b []byte) (int, error) {
	if w.held {
		return w.heldBuf.Write(b)
	}
	if w.cancels != nil && w.isOwnResponse(b) && w.cancels.finish(w.id.Raw()) {
		return len(b), nil
	}
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// isOwnResponse reports whether b (one SSE event, or a JSON body) is the
// JSON-RPC response to this writer's request.
func (w *rpcWriter) isOwnResponse(b []byte) bool {
	data := b
	if ct := w.Header().Get("Content-Type"); strings.HasPrefix(ct, "text/event-stream") {
		data = nil
		for _, line := range bytes.Split(b, []byte("\n")) {
			if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
				data = append(data, d...)
			}
		}
	}
	msg, err := jsonrpc.DecodeMessage(bytes.TrimSpace(data))
	resp, ok := msg.(*jsonrpc.Response)
	return err == nil && ok && resp.ID == w.id
}

// Flush implements http.Flusher.
func (w *rpcWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok && !w.held {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *rpcWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// end sends a held 400: as JSON-RPC error -32601 when the SDK refused the
// method as unknown, unchanged otherwise.
func (w *rpcWriter) end(req *jsonrpc.Request) {
	if !w.held {
		return
	}
	text := w.heldBuf.String()
	if !strings.HasPrefix(text, "JSON RPC not handled") {
		w.ResponseWriter.WriteHeader(http.StatusBadRequest)
		w.ResponseWriter.Write(w.heldBuf.Bytes())
		return
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID.Raw(),
		"error": map[string]any{"code": jsonrpc.CodeMethodNotFound, "message": "method not found: " + req.Method}})
	h := w.ResponseWriter.Header()
	h.Del("X-Content-Type-Options")
	h.Set("Content-Type", "application/json")
	w.ResponseWriter.WriteHeader(http.StatusOK)
	w.ResponseWriter.Write(b)
}
