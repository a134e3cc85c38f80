package server

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// reqRecord collects what a request's log line says that only the
// handlers learn: the authenticated key and the sandbox a create made.
type reqRecord struct {
	keyID     string
	sandboxID string
}

type recKey struct{}

func recordOf(r *http.Request) *reqRecord {
	rec, _ := r.Context().Value(recKey{}).(*reqRecord)
	return rec
}

// noteKey records the authenticated key's ID (never the key) for the log.
func noteKey(r *http.Request, id string) {
	if rec := recordOf(r); rec != nil {
		rec.keyID = id
	}
}

// noteSandbox records the sandbox a request made, for the log.
func noteSandbox(r *http.Request, id string) {
	if rec := recordOf(r); rec != nil {
		rec.sandboxID = id
	}
}

// statusWriter remembers the status and size of a response. It passes
// Flush and Hijack through (server-sent events, the PTY's WebSocket) and
// unwraps for http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status   int
	bytes    int64
	hijacked bool
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// Flush implements http.Flusher.
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack implements http.Hijacker.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return c, rw, err
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// quietRoutes are logged at debug level: probes and scrapes would drown
// the log at info.
var quietRoutes = map[string]bool{"GET /healthz": true, "GET /metrics": true}

// ServeHTTP implements http.Handler: it serves the request (route) and
// writes one log line and one histogram sample for it. The line names
// the route pattern, never the raw path or query (a dashboard link or a
// mistaken client may carry a key there), and the key's ID, never the
// key.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &reqRecord{}
	r = r.WithContext(context.WithValue(r.Context(), recKey{}, rec))
	sw := &statusWriter{ResponseWriter: w}
	e2bReq := s.e2b.Match(r)
	defer func() {
		p := recover()
		status := sw.status
		switch {
		case sw.hijacked:
			status = http.StatusSwitchingProtocols
		case p != nil && status == 0:
			status = http.StatusInternalServerError
		case status == 0:
			status = http.StatusOK
		}
		s.logRequest(r, rec, e2bReq, status, sw.bytes, time.Since(start), p != nil)
		if p != nil {
			panic(p)
		}
	}()
	s.route(sw, r)
}

func (s *Server) logRequest(r *http.Request, rec *reqRecord, e2bReq bool, status int, bytes int64, d time.Duration, panicked bool) {
	route := r.Pattern
	sandbox := rec.sandboxID
	if sandbox == "" && strings.Contains(route, "/sandboxes/{id}") {
		// Other routes' {id} (a key's, an approval's) is no sandbox.
		sandbox = r.PathValue("id")
	}
	if e2bReq {
		// E2B's protocol (package e2b) routes on its own: its control
		// plane's patterns, or a sandbox's envd or port (by header or
		// by host name, which it turns into the header).
		switch id := r.Header.Get("E2b-Sandbox-Id"); {
		case id != "":
			route, sandbox = "e2b sandbox", id
		case route != "":
			route = "e2b " + route
		default:
			route = "e2b unmatched"
		}
	}
	if route == "" {
		route = "unmatched"
	}
	sandbox = loggableID(sandbox)
	method := methodLabel(r.Method)
	s.prom.http.WithLabelValues(method, route, strconv.Itoa(status)).Observe(d.Seconds())
	if op := timedOps[route]; op != "" {
		st := "ok"
		if status >= 400 {
			st = codeFor(status)
		}
		rt := s.m.RuntimeOf(sandbox)
		if rt == "" {
			rt = "unknown"
		}
		s.prom.observeOp(op, rt, st, d)
	}
	level := slog.LevelInfo
	switch {
	case status >= 500 || panicked:
		level = slog.LevelError
	case quietRoutes[route]:
		level = slog.LevelDebug
	}
	ctx := context.WithoutCancel(r.Context())
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("method", method), slog.String("route", route), slog.Int("status", status),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000), slog.Int64("bytes", bytes), slog.String("remote", remoteIP(r))}
	if rec.keyID != "" {
		attrs = append(attrs, slog.String("key_id", rec.keyID))
	}
	if sandbox != "" {
		attrs = append(attrs, slog.String("sandbox_id", sandbox))
	}
	if panicked {
		attrs = append(attrs, slog.Bool("panic", true))
	}
	s.log.LogAttrs(ctx, level, "request", attrs...)
}

// loggableID is id if it has the form of a sandbox id ("sb-" and hex
// digits), else "invalid": the id in a path or header is the client's,
// and a key pasted there by mistake must not reach the log.
func loggableID(id string) string {
	hexPart, ok := strings.CutPrefix(id, "sb-")
	if id == "" {
		return ""
	}
	if !ok || hexPart == "" || len(hexPart) > 64 || strings.Trim(hexPart, "0123456789abcdef") != "" {
		return "invalid"
	}
	return id
}

// remoteIP is the client's address without its port.
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
