// Package server is airlock's HTTP API: JSON over HTTP with Server-Sent
// Events for streams, bearer-token auth, strict request decoding and size
// caps. api/openapi.yaml is its contract. All sandbox work is delegated to
// the manager; file operations run inside the sandbox through its agent, so
// the server never resolves a sandbox-controlled path on the host.
package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/airlock-dev/airlock/api"
	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/dashboard"
	"github.com/airlock-dev/airlock/e2b"
	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/internal/version"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/mcp"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/portlink"
	"github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/store"
)

// Size caps on request bodies.
const (
	// MaxJSONBody caps a JSON request body.
	MaxJSONBody = 1 << 20
	// MaxFileBody caps an uploaded file by default.
	MaxFileBody = 256 << 20
)

// Config configures a Server.
type Config struct {
	// Manager runs the sandboxes. Required.
	Manager *manager.Manager
	// Store authenticates API keys. Required unless NoAuth.
	Store *store.Store
	// NoAuth disables authentication; every request acts as owner "".
	// The caller must only allow it on a loopback listener.
	NoAuth bool
	// Version is reported by GET /v1/info.
	Version string
	// Layers reports the isolation layers this host enforces (GET
	// /v1/info); called once, lazily.
	Layers func() runtime.Enforced
	// MaxFileBytes caps file uploads; 0 means MaxFileBody.
	MaxFileBytes int64
	// Images is the image store behind /v1/images; nil answers 503.
	Images *imagestore.Store
	// ImageRegistries are the registries (host[:port], or "*") that
	// POST /v1/images may pull from; none by default.
	ImageRegistries []string
	// MCPIdle ends an MCP-over-HTTP session, and kills its default
	// sandbox, after this long without a request; 0 means
	// mcp.DefaultSessionTimeout.
	MCPIdle time.Duration
	// E2BMaxNetwork is the most network access an E2B create may ask for
	// (e2b.Config.MaxNetwork); empty means open.
	E2BMaxNetwork policy.NetworkMode
	// Approvals holds high-risk actions for a human (docs/approvals.md);
	// nil lets every action run at once.
	Approvals *approval.Gate
	// Approvers are the API key IDs that may see and answer every
	// approval (airlock serve --approver-key).
	Approvers []string
	// WebhookSecret verifies signed approval answers (the webhook
	// receiver's callbacks); empty refuses them.
	WebhookSecret []byte
	// E2BDomain routes requests for PORT-SANDBOXID.E2BDomain to sandbox
	// ports (e2b.Config.Domain); empty means header routing only.
	E2BDomain string
	// RelayDomain gives sandbox pages origins of their own: links to a
	// sandbox's port (POST /v1/sandboxes/{id}/stream) are served at
	// l-ID.RelayDomain, which must resolve to this server (package
	// portlink); empty: no such links.
	RelayDomain string
	// Logger writes the request log (one line per request) and the
	// server's other lines; nil means slog.Default().
	Logger *slog.Logger
	// Metrics are the series of GET /metrics; nil makes a registry of
	// the server's own (manager operations then go untimed unless the
	// caller gave its Observe to manager.Config.Observe). One Metrics
	// serves one Server.
	Metrics *Metrics
}

// Server serves the API.
type Server struct {
	cfg Config
	m   *manager.Manager
	mux *http.ServeMux
	mcp http.Handler
	e2b *e2b.Handler
	// dash serves the web UI and its sessions (server/dashboard.go).
	dash *dashboard.Handler

	// links are the capability links of Config.RelayDomain
	// (server/stream.go); nil without one.
	links *portlink.Links

	// gate holds actions for approval (Config.Approvals).
	gate *approval.Gate

	layersOnce atomic.Pointer[runtime.Enforced]

	execs, errors5xx, errors4xx, requests atomic.Int64

	// keyReqs are the running requests of each key (keywatch.go).
	keyReqs keyRequests

	// log is Config.Logger; prom and promHandler serve /metrics
	// (server/metrics.go).
	log         *slog.Logger
	prom        *Metrics
	promHandler http.Handler
}

// New returns the API handler.
func New(cfg Config) (*Server, error) {
	if cfg.Manager == nil || (cfg.Store == nil && !cfg.NoAuth) {
		return nil, errors.New("server: Manager and Store are required")
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = MaxFileBody
	}
	s := &Server{cfg: cfg, m: cfg.Manager, mux: http.NewServeMux(), gate: cfg.Approvals, log: cfg.Logger, prom: cfg.Metrics}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.prom == nil {
		s.prom = NewMetrics()
	}
	s.registerLegacy()
	s.promHandler = s.prom.handler()
	tools, err := mcp.New(mcp.Config{Manager: cfg.Manager, Version: cfg.Version, SessionTimeout: cfg.MCPIdle, Approvals: cfg.Approvals})
	if err != nil {
		return nil, err
	}
	s.mcp = tools.HTTPHandler()
	// E2B's protocol (package e2b) on the same listener: the E2B SDKs work
	// against this server with E2B_API_URL and E2B_SANDBOX_URL.
	if s.e2b, err = e2b.NewHandler(e2b.Config{Manager: cfg.Manager, Store: cfg.Store, NoAuth: cfg.NoAuth,
		MaxFileBytes: cfg.MaxFileBytes, MaxNetwork: cfg.E2BMaxNetwork, Domain: cfg.E2BDomain, Interpreter: e2b.AgentInterpreter{},
		NoteKey: noteKey}); err != nil {
		return nil, err
	}
	if err := s.relayRoutes(); err != nil {
		return nil, err
	}
	s.routes()
	if err := s.dashboardRoutes(); err != nil {
		return nil, err
	}
	// Anomaly signals for /metrics and the audit log.
	cfg.Manager.WatchAnomalies(0)
	return s, nil
}

// keyInfo is the authenticated caller.
type keyInfo struct {
	id           string
	maxSandboxes int
	// admin keys may manage keys (server/keys.go).
	admin bool
}

type ctxKey struct{}

func caller(r *http.Request) keyInfo {
	k, _ := r.Context().Value(ctxKey{}).(keyInfo)
	return k
}

// handler is an API handler that may fail with an error mapped to JSON.
type handler func(w http.ResponseWriter, r *http.Request) error

func (s *Server) routes() {
	open := func(pattern string, h handler) { s.mux.Handle(pattern, s.wrap(h, false)) }
	authed := func(pattern string, h handler) { s.mux.Handle(pattern, s.wrap(h, true)) }
	open("GET /healthz", func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok\n")
		return nil
	})
	open("GET /v1/openapi.yaml", func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "application/yaml")
		w.Write(api.OpenAPI)
		return nil
	})
	authed("GET /metrics", s.prometheus)
	authed("GET /v1/info", s.info)
	authed("GET /v1/audit", s.audit)
	authed("POST /v1/sandboxes", s.createSandbox)
	authed("GET /v1/sandboxes", s.listSandboxes)
	authed("GET /v1/sandboxes/{id}", s.getSandbox)
	authed("DELETE /v1/sandboxes/{id}", s.killSandbox)
	authed("POST /v1/sandboxes/{id}/timeout", s.setTimeout)
	authed("POST /v1/sandboxes/{id}/pause", s.pauseSandbox)
	authed("POST /v1/sandboxes/{id}/resume", s.resumeSandbox)
	authed("POST /v1/sandboxes/{id}/snapshots", s.memorySnapshot)
	authed("GET /v1/sandboxes/{id}/metrics", s.metrics)
	authed("POST /v1/sandboxes/{id}/exec", s.exec)
	authed("GET /v1/sandboxes/{id}/processes", s.processes)
	authed("POST /v1/sandboxes/{id}/processes/{pid}/stdin", s.stdin)
	authed("POST /v1/sandboxes/{id}/processes/{pid}/signal", s.signal)
	authed("POST /v1/sandboxes/{id}/kill-processes", s.killProcesses)
	authed("GET /v1/sandboxes/{id}/processes/{pid}/events", s.events)
	authed("GET /v1/sandboxes/{id}/processes/{pid}/logs", s.logs)
	authed("GET /v1/sandboxes/{id}/pty", s.pty)
	authed(portsPattern, s.port)
	authed("GET /v1/sandboxes/{id}/files", s.readFile)
	authed("PUT /v1/sandboxes/{id}/files", s.writeFile)
	authed("DELETE /v1/sandboxes/{id}/files", s.removeFile)
	authed("GET /v1/sandboxes/{id}/files/list", s.listFiles)
	authed("GET /v1/sandboxes/{id}/files/stat", s.statFile)
	authed("POST /v1/sandboxes/{id}/files/mkdir", s.mkdir)
	authed("POST /v1/sandboxes/{id}/files/move", s.move)
	authed("POST /v1/sandboxes/{id}/computer", s.computer)
	authed("POST /v1/sandboxes/{id}/stream", s.stream)
	authed("POST /v1/sandboxes/{id}/links", s.link)
	s.networkRoutes(authed)
	s.imageRoutes(authed)
	s.codeRoutes(authed)
	s.approvalRoutes(authed)
	s.keyRoutes(authed)
	// MCP clients probe OAuth discovery before sending a token: tell
	// them a bearer key is the way in (mcp.OAuthDiscovery).
	for _, p := range []string{"/.well-known/oauth-protected-resource", "/.well-known/oauth-authorization-server",
		"/.well-known/openid-configuration"} {
		s.mux.Handle("GET "+p, mcp.OAuthDiscovery())
		s.mux.Handle("GET "+p+"/", mcp.OAuthDiscovery())
	}
	// MCP over streamable HTTP (package mcp), acting for the caller's key.
	authed("/mcp", func(w http.ResponseWriter, r *http.Request) error {
		k := caller(r)
		s.mcp.ServeHTTP(w, r.WithContext(mcp.WithCaller(r.Context(), mcp.Caller{Owner: k.id, MaxSandboxes: k.maxSandboxes})))
		return nil
	})
}

// route serves a request (ServeHTTP logs it).
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	if s.links != nil && s.links.Match(r.Host) {
		// A sandbox page's own origin: not the API (server/stream.go).
		s.serveLink(w, r)
		return
	}
	guarded := r
	if s.sandboxOwnOrigin(r) {
		guarded = r.Clone(r.Context())
		guarded.Header.Del("Origin")
	}
	if msg := browserGuard(guarded, s.cfg.NoAuth); msg != "" {
		s.count(http.StatusForbidden)
		writeError(w, http.StatusForbidden, "forbidden", msg)
		return
	}
	if msg := s.pageGuard(r); msg != "" {
		s.count(http.StatusForbidden)
		writeError(w, http.StatusForbidden, "forbidden", msg)
		return
	}
	if s.e2b.Match(r) {
		s.e2b.ServeHTTP(w, r)
		return
	}
	if _, pattern := s.mux.Handler(r); pattern == "" {
		// Unknown route or wrong method: answer in our error format.
		code, msg := http.StatusNotFound, "no such endpoint"
		if rr := r.Clone(r.Context()); true {
			for _, m := range []string{"GET", "POST", "PUT", "DELETE"} {
				rr.Method = m
				if _, p := s.mux.Handler(rr); p != "" {
					code, msg = http.StatusMethodNotAllowed, "method not allowed"
					break
				}
			}
		}
		s.count(code)
		writeError(w, code, codeFor(code), msg)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) count(code int) {
	switch {
	case code >= 500:
		s.errors5xx.Add(1)
	case code >= 400:
		s.errors4xx.Add(1)
	}
}

// wrap authenticates (if required) and maps a handler's error to JSON.
func (s *Server) wrap(h handler, auth bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if auth {
			k, secret, err := s.authenticateSecret(r)
			var unavailable *apiError
			if errors.As(err, &unavailable) {
				s.count(unavailable.status)
				writeError(w, unavailable.status, unavailable.code, unavailable.msg)
				return
			}
			if err != nil {
				s.count(http.StatusUnauthorized)
				w.Header().Set("WWW-Authenticate", `Bearer realm="airlock"`)
				writeError(w, http.StatusUnauthorized, "unauthorized", err.Error())
				return
			}
			noteKey(r, k.id)
			ctx := context.WithValue(r.Context(), ctxKey{}, k)
			if secret != "" {
				// A revoked key's running request (a terminal, a
				// stream) ends too, not only its next one.
				var stop func()
				ctx, stop = s.watchKey(ctx, k.id, secret)
				defer stop()
			}
			r = r.WithContext(ctx)
		}
		if err := h(w, r); err != nil {
			status, code, msg := classify(err)
			s.count(status)
			writeError(w, status, code, msg)
		}
	})
}

func (s *Server) authenticate(r *http.Request) (keyInfo, error) {
	k, _, err := s.authenticateSecret(r)
	return k, err
}

// authenticateSecret is authenticate that also returns the key's secret
// ("" without auth), for watchKey: never to be logged or answered.
func (s *Server) authenticateSecret(r *http.Request) (keyInfo, string, error) {
	if s.cfg.NoAuth {
		return keyInfo{}, "", nil
	}
	h := r.Header.Get("Authorization")
	if key, ok, err := s.sessionKey(r); ok {
		if err != nil {
			return keyInfo{}, "", err
		}
		h = "Bearer " + key
	}
	const prefix = "Bearer "
	if len(h) < len(prefix) || subtle.ConstantTimeCompare([]byte(strings.ToLower(h[:len(prefix)])), []byte("bearer ")) != 1 {
		return keyInfo{}, "", errors.New("missing bearer token (Authorization: Bearer al_...)")
	}
	secret := strings.TrimSpace(h[len(prefix):])
	k, err := s.cfg.Store.Authenticate(r.Context(), secret)
	if err != nil {
		if !errors.Is(err, store.ErrUnauthorized) {
			// Fail closed, but say why: the key store (a shared
			// database) is unreachable, not the key wrong. Its address
			// is not for unauthenticated callers.
			return keyInfo{}, "", errf(http.StatusServiceUnavailable, "key_store_unavailable",
				"the API key cannot be checked now: the key store is unavailable; retry later")
		}
		return keyInfo{}, "", errors.New("invalid or revoked API key")
	}
	return keyInfo{id: k.ID, maxSandboxes: k.MaxSandboxes, admin: k.Admin}, secret, nil
}

// apiError is an error with an explicit HTTP status and code.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func errf(status int, code, format string, args ...any) error {
	return &apiError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func codeFor(status int) string {
	switch status {
	case 400:
		return "bad_request"
	case 401:
		return "unauthorized"
	case 403:
		return "forbidden"
	case 404:
		return "not_found"
	case 405:
		return "method_not_allowed"
	case 409:
		return "conflict"
	case 413:
		return "too_large"
	case 415:
		return "unsupported_media_type"
	case 422:
		return "invalid_policy"
	case 429:
		return "limit_reached"
	case 507:
		return "no_space"
	}
	return "internal"
}

// classify maps an error to status, code and message.
func classify(err error) (int, string, string) {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status, ae.code, ae.msg
	}
	var apr *approval.Error
	if errors.As(err, &apr) {
		return 403, apr.Code, apr.Msg
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return 413, "too_large", fmt.Sprintf("request body larger than %d bytes", mbe.Limit)
	}
	switch {
	case errors.Is(err, manager.ErrNotFound):
		return 404, "not_found", "sandbox not found"
	case errors.Is(err, manager.ErrNoSnapshot):
		return 404, "not_found", err.Error()
	case errors.Is(err, manager.ErrNotRunning):
		return 409, "not_running", err.Error()
	case errors.Is(err, manager.ErrLimit):
		return 429, "limit_reached", err.Error()
	case errors.Is(err, manager.ErrPolicy):
		return 422, "invalid_policy", err.Error()
	case errors.Is(err, manager.ErrInvalid):
		return 400, "bad_request", err.Error()
	case errors.Is(err, manager.ErrAudit) && errors.Is(err, store.ErrNoSpace):
		return 507, "no_space", err.Error()
	case errors.Is(err, manager.ErrAudit):
		return 503, "audit_unavailable", err.Error()
	case errors.Is(err, store.ErrNoSpace):
		return 507, "no_space", err.Error()
	case errors.Is(err, manager.ErrClosed):
		return 503, "unavailable", err.Error()
	}
	if st, code, ok := agentStatus(err); ok {
		return st, code, agentMessage(err)
	}
	return 500, "internal", err.Error()
}

// errorBody is the JSON error envelope.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var b errorBody
	b.Error.Code, b.Error.Message = code, msg
	writeJSON(w, status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.Encode(v)
}

// decode reads one JSON object from a capped body, rejecting unknown
// fields and trailing data.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, MaxJSONBody)
	return DecodeJSON(body, v)
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) error {
	layers := s.layersOnce.Load()
	if layers == nil {
		var l runtime.Enforced
		if s.cfg.Layers != nil {
			l = s.cfg.Layers()
		}
		s.layersOnce.Store(&l)
		layers = &l
	}
	build := version.Get()
	writeJSON(w, 200, map[string]any{
		"version": s.cfg.Version,
		// The commit and its date this server was built from
		// (internal/version; "" when the build carries neither).
		"commit":     build.Commit,
		"build_date": build.Date,
		"runtimes":   s.m.Runtimes(),
		// What each runtime can do beyond exec and files (runtime/tier.Caps):
		// a request for what a runtime lacks is refused with 422 naming it.
		"runtime_capabilities": s.m.RuntimeCaps(),
		"enforced":             *layers,
		"auth":                 !s.cfg.NoAuth,
		// Ready sandboxes in the warm pool (airlock serve --pool).
		"pool_idle": s.m.PoolIdle(),
		// Sandboxes the backend keeps claimed and enrolled per pooled
		// profile (serve --backend kubernetes --pool-reserve).
		"pool_reserve": s.m.PoolReserve(),
		// The largest limits a sandbox may ask for (airlock serve --max-*);
		// an API key may set lower ones of its own.
		"ceilings": s.m.Ceilings(),
		// The runtime of sandboxes created without one (airlock serve
		// --default-runtime).
		"default_runtime": s.m.DefaultRuntime(),
		// The binary each sandbox runs as its agent: the agent-only
		// airlock-agent when serve found a matching one, else airlock.
		"agent_binary": s.m.AgentBinary(),
	})
	return nil
}

// CreateRequest is the body of POST /v1/sandboxes.
type CreateRequest struct {
	Profile  string            `json:"profile,omitempty"`
	Limits   *manager.Limits   `json:"limits,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Timeout is the TTL in seconds.
	Timeout float64 `json:"timeout,omitempty"`
	// Network is the network policy (default mode none).
	Network *NetworkRequest `json:"network,omitempty"`
	// Secrets are headers the egress proxy injects; their values never
	// reach the sandbox, the store or the audit log.
	Secrets []egress.Secret `json:"secrets,omitempty"`
	// Runtime is the isolation tier: native or gvisor (default: the
	// server's --default-runtime).
	Runtime string `json:"runtime,omitempty"`
	// Image makes the sandbox's root from an image of the server's store
	// (GET /v1/images): writable, on disk.
	Image string `json:"image,omitempty"`
	// User "root" runs an image sandbox as uid 0 of its own user namespace
	// with the capabilities package managers need there (never host
	// root); "" means the image's user.
	User string `json:"user,omitempty"`
	// Volumes mounts named volumes (POST /v1/volumes) read-write.
	Volumes []manager.VolumeRef `json:"volumes,omitempty"`
	// Snapshot forks a gvisor sandbox: the id of one of its snapshots
	// (POST /v1/sandboxes/{id}/snapshots).
	Snapshot string `json:"snapshot,omitempty"`
	// Approval adds approval rules for this sandbox to the server's and
	// the key's (docs/approvals.md); it can only require more.
	Approval *approval.Policy `json:"approval,omitempty"`
}

// maxSeconds is the largest timeout a request may give, in seconds.
const maxSeconds = 1e7

func seconds(f float64) (time.Duration, error) {
	if f < 0 || f > maxSeconds || f != f {
		return 0, errf(400, "bad_request", "timeout out of range: give seconds from 0 to %d", int(maxSeconds))
	}
	return time.Duration(f * float64(time.Second)), nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req CreateRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	d, err := seconds(req.Timeout)
	if err != nil {
		return err
	}
	if err := s.approveCreate(r, &req); err != nil {
		return err
	}
	k := caller(r)
	cr := manager.CreateRequest{Owner: k.id, OwnerLimit: k.maxSandboxes, Profile: req.Profile,
		Env: req.Env, Metadata: req.Metadata, Timeout: d}
	if req.Limits != nil {
		cr.Limits = *req.Limits
	}
	if req.Network != nil {
		cr.Network = req.Network.policy()
	}
	cr.Secrets = req.Secrets
	cr.Runtime = req.Runtime
	cr.Image = req.Image
	cr.User = req.User
	cr.Volumes = req.Volumes
	cr.Snapshot = req.Snapshot
	info, err := s.m.Create(r.Context(), cr)
	if err != nil {
		return err
	}
	if err := s.gate.SetSandboxPolicy(info.ID, req.Approval); err != nil {
		// Fail closed: no sandbox runs without the rules it was asked with.
		s.m.Kill(context.WithoutCancel(r.Context()), k.id, info.ID)
		return fmt.Errorf("sandbox %s killed: %w", info.ID, err)
	}
	noteSandbox(r, info.ID)
	writeJSON(w, 201, info)
	return nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	opts := manager.ListOptions{Metadata: map[string]string{}}
	for k, vs := range r.URL.Query() {
		switch {
		case strings.HasPrefix(k, "metadata."):
			if len(vs) != 1 {
				return errf(400, "bad_request", "repeated filter %s", k)
			}
			opts.Metadata[strings.TrimPrefix(k, "metadata.")] = vs[0]
		case k == "state":
			for _, v := range vs {
				for _, st := range strings.Split(v, ",") {
					switch st {
					case store.StateRunning, store.StateKilled, store.StateExpired, store.StateLost, store.StateExited:
						opts.States = append(opts.States, st)
					default:
						return errf(400, "bad_request", "unknown state %q: give one or more of %s, %s, %s, %s, %s (comma-separated)",
							st, store.StateRunning, store.StateKilled, store.StateExpired, store.StateLost, store.StateExited)
					}
				}
			}
		case k == "limit":
			n, err := strconv.Atoi(vs[0])
			if err != nil || n < 1 || n > 1000 || len(vs) != 1 {
				return errf(400, "bad_request", "limit must be an integer in [1, 1000]")
			}
			opts.Limit = n
		case k == "after":
			if len(vs) != 1 {
				return errf(400, "bad_request", "repeated after")
			}
			opts.After = vs[0]
		default:
			return errf(400, "bad_request", "unknown query parameter %q", k)
		}
	}
	if opts.Limit == 0 {
		opts.Limit = 1000
	}
	list, err := s.m.List(r.Context(), caller(r).id, opts)
	if err != nil {
		return err
	}
	resp := map[string]any{"sandboxes": list}
	if len(list) == opts.Limit {
		// Possibly more: ask again with after=next.
		resp["next"] = list[len(list)-1].ID
	}
	writeJSON(w, 200, resp)
	return nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	info, err := s.m.Get(r.Context(), caller(r).id, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, info)
	return nil
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	// Idempotent: killing an ended sandbox answers its (final) state.
	if err := s.m.Kill(r.Context(), caller(r).id, id); err != nil && !errors.Is(err, manager.ErrNotRunning) {
		return err
	}
	info, err := s.m.Get(r.Context(), caller(r).id, id)
	if err != nil {
		return err
	}
	writeJSON(w, 200, info)
	return nil
}

// TimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout.
type TimeoutRequest struct {
	// Timeout is the new TTL in seconds, from now.
	Timeout float64 `json:"timeout"`
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var req TimeoutRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	d, err := seconds(req.Timeout)
	if err != nil {
		return err
	}
	info, err := s.m.SetTimeout(r.Context(), caller(r).id, r.PathValue("id"), d)
	if err != nil {
		return err
	}
	writeJSON(w, 200, info)
	return nil
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) error {
	mt, err := s.m.Metrics(r.Context(), caller(r).id, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, mt)
	return nil
}

// sandbox returns the caller's running sandbox named in the path.
func (s *Server) sandbox(r *http.Request) (*manager.Sandbox, error) {
	sb, err := s.m.Lookup(caller(r).id, r.PathValue("id"))
	if errors.Is(err, manager.ErrPaused) {
		return nil, errPaused(r.PathValue("id"))
	}
	return sb, err
}

// browserGuard refuses what a web page could send to a server on the
// developer's machine: any cross-origin request (API clients and SDKs send
// no Origin header; the dashboard's own pages send this server's origin
// and dashboard.CSRFHeader: dashboard.SameOrigin), and, without
// authentication, any Host but a loopback one (DNS rebinding: evil.example resolving to 127.0.0.1). It returns the
// reason, or "" to let the request through.
func browserGuard(r *http.Request, noAuth bool) string {
	if o := r.Header.Get("Origin"); o != "" && !dashboard.SameOrigin(r) {
		return "cross-origin requests are refused (Origin: " + o + "); call the API from a program, not a web page"
	}
	if !noAuth {
		return ""
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return ""
	}
	return "this server runs without authentication and only answers requests addressed to a loopback host, not " + r.Host
}
