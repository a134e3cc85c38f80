// Package e2b serves the wire protocol of E2B (https://e2b.dev) on top of
// airlock's manager, so that the official E2B SDKs (the e2b and
// @e2b/code-interpreter npm packages, and the Python ones, which speak the
// same protocol) work unchanged against `airlock serve` once E2B_API_URL
// and E2B_SANDBOX_URL point at it.
//
// Three planes share the listener:
//
//   - the control plane (/sandboxes, /v2/sandboxes...), authenticated by
//     X-API-KEY, which holds an airlock API key;
//   - envd, the in-sandbox daemon of E2B: requests carrying the headers
//     E2b-Sandbox-Id and E2b-Sandbox-Port: 49983, authenticated by the
//     sandbox's envd access token (X-Access-Token). It speaks Connect RPC
//     with the JSON codec (process.Process and filesystem.Filesystem) plus
//     GET/POST /files;
//   - the code interpreter: E2b-Sandbox-Port: 49999.
//
// Sandboxes are the manager's: an E2B sandbox is an airlock sandbox, and
// everything runs inside it through its agent. See docs/e2b.md for what is
// supported.
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/store"
)

// EnvdVersion is the envd version airlock reports. The SDKs gate features
// on it; airlock implements those up to 0.6.4: stdin control 0.3.0, no
// default username 0.4.0, CloseStdin 0.5.2, octet-stream uploads 0.5.7,
// file metadata 0.6.2 (user.e2b.* extended attributes), entries in watch
// events 0.6.3, allowNetworkMounts 0.6.4 (nothing is a network mount).
const EnvdVersion = "0.6.4"

// Ports E2B addresses inside a sandbox.
const (
	// EnvdPort is envd's port.
	EnvdPort = 49983
	// InterpreterPort is the code interpreter's port.
	InterpreterPort = 49999
)

// Headers of the E2B wire protocol.
const (
	headerSandboxID    = "E2b-Sandbox-Id"
	headerSandboxPort  = "E2b-Sandbox-Port"
	headerAccessToken  = "X-Access-Token"
	headerTrafficToken = "E2b-Traffic-Access-Token"
	headerAPIKey       = "X-Api-Key"
)

// DefaultMaxFileBytes caps an uploaded file when Config.MaxFileBytes is 0.
const DefaultMaxFileBytes = 256 << 20

// Config configures a Handler.
type Config struct {
	// Manager runs the sandboxes. Required.
	Manager *manager.Manager
	// Store authenticates API keys and tells which key owns a sandbox.
	// Required unless NoAuth.
	Store *store.Store
	// NoAuth disables API key authentication: every request acts as
	// owner "", like airlock's own API with NoAuth. Per-sandbox access
	// tokens are still checked.
	NoAuth bool
	// SecretFile holds the key the per-sandbox access tokens are derived
	// from; it is created (mode 0600) if missing. Empty means the key in
	// the Store's shared database (store.Options.DatabaseURL) or e2b.key in
	// the store's directory, or, without a Store, a key that lives as long
	// as the process.
	SecretFile string
	// Profile is the airlock profile behind E2B's templates "base" and
	// "code-interpreter-v1"; empty means standard.
	Profile string
	// Interpreter runs the code interpreter's cells; nil makes its port
	// answer 501.
	Interpreter Interpreter
	// MaxNetwork is the most network access an E2B create or
	// updateNetwork may ask for (policy.NetNone, NetAllowlist or NetOpen);
	// more is refused with a 403. Empty means NetOpen: E2B's own meaning of
	// allowInternetAccess: true.
	MaxNetwork policy.NetworkMode
	// Domain, if set, routes requests by host as E2B does: a request for
	// PORT-SANDBOXID.Domain goes to that port of that sandbox, as if it
	// carried E2b-Sandbox-Id and E2b-Sandbox-Port. Creates answer it as
	// the sandbox's domain, so the SDKs' getHost(port) names such hosts.
	// Empty means header routing only.
	Domain string
	// MaxFileBytes caps a file upload; 0 means DefaultMaxFileBytes.
	MaxFileBytes int64
	// SnapshotDir keeps E2B's snapshots (createSnapshot). Empty means
	// e2b-snapshots in the Store's directory; without a Store, the server
	// keeps no snapshots (creating one is a 501).
	SnapshotDir string
	// SnapshotsPerKey caps the snapshots one key keeps; 0 means
	// DefaultSnapshotsPerKey.
	SnapshotsPerKey int
	// SnapshotBytes caps one snapshot's workspace archive; 0 means
	// DefaultSnapshotBytes.
	SnapshotBytes int64
	// Logf logs operational problems; log.Printf if nil.
	Logf func(format string, args ...any)
	// NoteKey, if set, is told the ID (never the secret) of the API key
	// each control-plane request authenticated with, for the server's
	// request log.
	NoteKey func(r *http.Request, keyID string)
}

// Handler serves the E2B protocol. It is safe for concurrent use.
type Handler struct {
	cfg     Config
	m       *manager.Manager
	control *http.ServeMux
	secret  []byte
	snaps   *snapshots   // nil: no snapshots
	secrets *secretStore // nil: no secrets
	tb      templateBuilds
	// tmplDir records SDK templates' start and ready commands ("": none).
	tmplDir string

	owners sync.Map // sandbox id -> owner key id, for the sandboxes in boxes

	mu    sync.Mutex
	boxes map[string]*boxState
}

// NewHandler returns the E2B handler.
func NewHandler(cfg Config) (*Handler, error) {
	if cfg.Manager == nil || (cfg.Store == nil && !cfg.NoAuth) {
		return nil, errors.New("e2b: Manager and Store are required")
	}
	if cfg.Profile == "" {
		cfg.Profile = "standard"
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.MaxNetwork == "" {
		cfg.MaxNetwork = policy.NetOpen
	}
	if _, err := ParseMaxNetwork(string(cfg.MaxNetwork)); err != nil {
		return nil, fmt.Errorf("e2b: MaxNetwork: %w", err)
	}
	if d := cfg.Domain; d != "" && (strings.ContainsAny(d, "/:@ ") || strings.HasPrefix(d, ".") || strings.HasSuffix(d, ".")) {
		return nil, fmt.Errorf("e2b: Domain %q is not a host name (want e.g. sandboxes.example.com)", d)
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	// Replicas on a shared database must verify each other's tokens: the
	// key is then kept there.
	shared := cfg.SecretFile == "" && cfg.Store != nil && cfg.Store.SharedDatabase() != ""
	if cfg.SecretFile == "" && cfg.Store != nil && !shared {
		cfg.SecretFile = filepath.Join(filepath.Dir(cfg.Store.Path()), "e2b.key")
	}
	secret := make([]byte, 32)
	if shared {
		var err error
		if secret, err = cfg.Store.SharedSecret(context.Background(), "e2b.token_key", 32); err != nil {
			return nil, fmt.Errorf("e2b: token key: %w", err)
		}
	} else if cfg.SecretFile == "" {
		if _, err := rand.Read(secret); err != nil {
			return nil, fmt.Errorf("e2b: token key: %w", err)
		}
	} else {
		var err error
		if secret, err = loadSecret(cfg.SecretFile); err != nil {
			return nil, err
		}
	}
	h := &Handler{cfg: cfg, m: cfg.Manager, secret: secret, boxes: map[string]*boxState{},
		tb: templateBuilds{builds: map[string]*tmplBuild{}, sem: make(chan struct{}, 2)}}
	if cfg.SnapshotDir == "" && cfg.Store != nil {
		cfg.SnapshotDir = filepath.Join(filepath.Dir(cfg.Store.Path()), "e2b-snapshots")
	}
	if cfg.Store != nil {
		dir := filepath.Join(filepath.Dir(cfg.Store.Path()), "e2b-secrets")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("e2b: secrets directory: %w", err)
		}
		h.secrets = &secretStore{dir: dir}
		h.tmplDir = filepath.Join(filepath.Dir(cfg.Store.Path()), "e2b-templates")
	}
	if cfg.SnapshotDir != "" {
		if err := os.MkdirAll(cfg.SnapshotDir, 0o700); err != nil {
			return nil, fmt.Errorf("e2b: snapshot directory: %w", err)
		}
		h.snaps = &snapshots{dir: cfg.SnapshotDir, perKey: cfg.SnapshotsPerKey, maxBytes: cfg.SnapshotBytes,
			pending: map[string]int{}, names: map[string]bool{}}
		if h.snaps.perKey <= 0 {
			h.snaps.perKey = DefaultSnapshotsPerKey
		}
		if h.snaps.maxBytes <= 0 {
			h.snaps.maxBytes = DefaultSnapshotBytes
		}
	}
	h.control = h.controlRoutes()
	return h, nil
}

// loadSecret reads the token key, creating it on first use.
func loadSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if len(b) < 32 {
			return nil, fmt.Errorf("e2b: token key %s is shorter than 32 bytes", path)
		}
		return b, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("e2b: read token key: %w", err)
	}
	b = make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("e2b: token key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return loadSecret(path) // created concurrently
	}
	if err != nil {
		return nil, fmt.Errorf("e2b: create token key: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("e2b: write token key: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("e2b: write token key: %w", err)
	}
	return b, nil
}

// token derives a per-sandbox token of the given kind. Tokens need no
// storage, survive server restarts, and are worthless once the sandbox is
// gone.
func (h *Handler) token(kind, id string) string {
	mac := hmac.New(sha256.New, h.secret)
	io.WriteString(mac, "airlock-e2b\x00"+kind+"\x00"+id)
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func (h *Handler) envdToken(id string) string    { return h.token("envd", id) }
func (h *Handler) trafficToken(id string) string { return h.token("traffic", id) }

// tokenOK compares a presented token in constant time.
func tokenOK(got, want string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// Match reports whether r belongs to the E2B protocol: it addresses a
// sandbox port (E2b-Sandbox-Id), carries an E2B API key, or names E2B's
// sandbox endpoints, which airlock's own API (under /v1) does not use.
func (h *Handler) Match(r *http.Request) bool {
	if r.Header.Get(headerSandboxID) != "" || r.Header.Get(headerAPIKey) != "" {
		return true
	}
	if _, _, ok := h.hostRoute(r.Host); ok {
		return true
	}
	p := r.URL.Path
	if strings.HasPrefix(p, templateUploadPrefix) {
		return true
	}
	for _, prefix := range []string{"/sandboxes", "/v2/sandboxes"} {
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			return true
		}
	}
	return false
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, port, ok := h.hostRoute(r.Host); ok {
		r.Header.Set(headerSandboxID, id)
		r.Header.Set(headerSandboxPort, port)
	}
	if id := r.Header.Get(headerSandboxID); id != "" {
		h.serveSandbox(w, r, id)
		return
	}
	if strings.HasPrefix(r.URL.Path, templateUploadPrefix) {
		h.serveTemplateUpload(w, r)
		return
	}
	h.control.ServeHTTP(w, r)
}

// apiError is an error of the control plane or of envd's HTTP endpoints;
// its body is E2B's {"code", "message"} with code the HTTP status.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func apiErrorf(status int, format string, args ...any) *apiError {
	return &apiError{status: status, msg: fmt.Sprintf(format, args...)}
}

// writeJSON writes v as the JSON body of a response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"code":500,"message":"encoding the response failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// writeAPIError writes E2B's error body.
func writeAPIError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

// ownerOf returns the API key id that owns sandbox id, and whether it is
// known.
func (h *Handler) ownerOf(ctx context.Context, id string) (string, bool) {
	if o, ok := h.owners.Load(id); ok {
		return o.(string), true
	}
	if h.cfg.Store == nil {
		return "", true // NoAuth: every sandbox belongs to owner ""
	}
	rec, err := h.cfg.Store.GetSandbox(ctx, id)
	if err != nil || rec.State != store.StateRunning {
		return "", false
	}
	return rec.Owner, true
}

// ownerLive refuses a request to sandbox id whose owner key was revoked
// (401) or cannot be checked (503): its access tokens stand for the key
// that created it, and stop working with it. It returns 0 to let the
// request through (no auth: owner "").
func (h *Handler) ownerLive(ctx context.Context, owner, id string) (int, string) {
	if owner == "" || h.cfg.NoAuth || h.cfg.Store == nil {
		return 0, ""
	}
	k, err := h.cfg.Store.GetKey(ctx, owner)
	switch {
	case errors.Is(err, store.ErrNotFound) || err == nil && k.RevokedAt != nil:
		return http.StatusUnauthorized, "the API key that created sandbox " + id + " was revoked: its access tokens no longer work"
	case err != nil:
		return http.StatusServiceUnavailable, "the API key behind sandbox " + id + " cannot be checked now: the key store is unavailable; retry later"
	}
	return 0, ""
}

// boxState is what the handler keeps per running sandbox: the processes
// started through envd and the directory watchers.
type boxState struct {
	h  *Handler
	sb *manager.Sandbox

	mu       sync.Mutex
	procs    map[int]*eproc
	watchers map[string]*watcher
	// metrics are the samples getMetrics has taken, oldest first.
	metrics []metricSample
	// home is homeDir's answer once known.
	home string
}

// homeDir is where E2B code's home is in the sandbox: /home/user where it
// is a directory (a second mount of the workspace: the native runtime's
// roots, and gVisor's with an agent), else the workspace (a sandbox of
// root, or a runtime whose root has no /home/user). Looked up once, through
// the agent; a failed look-up is not kept.
func (b *boxState) homeDir(ctx context.Context) string {
	b.mu.Lock()
	home := b.home
	b.mu.Unlock()
	if home != "" {
		return home
	}
	home = sandboxHome
	if b.sb.UserName() == "user" {
		fi, err := b.sb.Agent().Stat(ctx, E2BHome)
		var ae *agent.Error
		switch {
		case err == nil && fi.Type == agent.TypeDir:
			home = E2BHome
		case err != nil && !(errors.As(err, &ae) && ae.Code == agent.CodeNotFound):
			return sandboxHome
		}
	}
	b.mu.Lock()
	b.home = home
	b.mu.Unlock()
	return home
}

// box returns the state of a running sandbox, creating it on first use.
// It is dropped when the sandbox ends.
func (h *Handler) box(sb *manager.Sandbox) *boxState {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.boxes[sb.ID]; b != nil && b.sb == sb {
		return b
	}
	b := &boxState{h: h, sb: sb, procs: map[int]*eproc{}, watchers: map[string]*watcher{}}
	h.boxes[sb.ID] = b
	h.owners.Store(sb.ID, sb.Owner())
	go func() {
		<-sb.Ended()
		h.mu.Lock()
		if h.boxes[sb.ID] == b {
			delete(h.boxes, sb.ID)
		}
		h.mu.Unlock()
		h.owners.Delete(sb.ID)
		b.mu.Lock()
		ws := b.watchers
		b.watchers = map[string]*watcher{}
		b.mu.Unlock()
		for _, w := range ws {
			w.stop()
		}
	}()
	return b
}

// serveSandbox serves a request addressed to a port of sandbox id.
func (h *Handler) serveSandbox(w http.ResponseWriter, r *http.Request, id string) {
	port, err := strconv.Atoi(r.Header.Get(headerSandboxPort))
	if err != nil {
		writeAPIError(w, http.StatusBadRequest, "missing or bad "+headerSandboxPort+" header")
		return
	}
	// The token is checked before the sandbox is looked up, so that
	// callers without one learn nothing about which sandboxes exist.
	switch port {
	case EnvdPort:
		if r.Header.Get(headerAccessToken) == "" && signedFileRequest(r) {
			// A signed URL (uploadUrl, downloadUrl) stands in for
			// the token.
			if msg, ok := checkFileSignature(r, h.envdToken(id), time.Now()); !ok {
				writeAPIError(w, http.StatusUnauthorized, msg)
				return
			}
		} else if !tokenOK(r.Header.Get(headerAccessToken), h.envdToken(id)) {
			writeAPIError(w, http.StatusUnauthorized, "missing or wrong "+headerAccessToken+" for sandbox "+id)
			return
		}
	case InterpreterPort:
		if !tokenOK(r.Header.Get(headerAccessToken), h.envdToken(id)) &&
			!tokenOK(r.Header.Get(headerTrafficToken), h.trafficToken(id)) {
			writeAPIError(w, http.StatusUnauthorized, "missing or wrong access token for sandbox "+id)
			return
		}
	default:
		if port < 1 || port > 65535 {
			writeAPIError(w, http.StatusBadRequest, fmt.Sprintf("bad %s %d", headerSandboxPort, port))
			return
		}
		if !tokenOK(r.Header.Get(headerTrafficToken), h.trafficToken(id)) &&
			!tokenOK(r.Header.Get(headerAccessToken), h.envdToken(id)) {
			// 403, as E2B's proxy answers a sandbox whose traffic is not
			// public (E2B's network.test.ts); envd's and the
			// interpreter's ports answer 401, as envd does.
			writeAPIError(w, http.StatusForbidden, "missing or wrong "+headerTrafficToken+" for sandbox "+id+": ports of airlock sandboxes are never public")
			return
		}
	}
	owner, ok := h.ownerOf(r.Context(), id)
	var sb *manager.Sandbox
	if ok {
		sb, err = h.lookupResuming(r, owner, id)
	}
	if !ok || err != nil {
		// E2B's proxy answers 502 for a sandbox that is not running; the
		// SDKs turn it into their "sandbox timed out or was killed" error.
		writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway,
			"message": "The sandbox " + id + " was not found or is not running", "sandboxId": id})
		return
	}
	if status, msg := h.ownerLive(r.Context(), owner, id); status != 0 {
		writeAPIError(w, status, msg)
		return
	}
	switch port {
	case InterpreterPort:
		h.serveInterpreter(w, r, h.box(sb))
	case EnvdPort:
		r = r.WithContext(context.WithValue(r.Context(), sandboxUserKey{}, sb.UserName()))
		h.serveEnvd(w, r, h.box(sb))
	default:
		h.servePort(w, r, sb, port)
	}
}

// serveEnvd routes a request to envd's endpoints.
func (h *Handler) serveEnvd(w http.ResponseWriter, r *http.Request, b *boxState) {
	p := r.URL.Path
	if svc, method, ok := strings.Cut(strings.TrimPrefix(p, "/"), "/"); ok && strings.Contains(svc, ".") {
		h.serveRPC(w, r, b, svc, method)
		return
	}
	switch {
	case p == "/health" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		w.WriteHeader(http.StatusNoContent)
	case p == "/files" && r.Method == http.MethodGet:
		h.readFile(w, r, b)
	case p == "/files" && r.Method == http.MethodPost:
		h.writeFiles(w, r, b)
	case p == "/files":
		w.Header().Set("Allow", "GET, POST")
		writeAPIError(w, http.StatusMethodNotAllowed, "method not allowed")
	default:
		writeAPIError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not an envd endpoint airlock serves", r.Method, p))
	}
}

// serveRPC routes a Connect RPC to its handler.
func (h *Handler) serveRPC(w http.ResponseWriter, r *http.Request, b *boxState, svc, method string) {
	switch svc + "/" + method {
	case "process.Process/Start":
		serveStream(w, r, func(ctx context.Context, c *rpcCall, req []byte, send func(any) error) error {
			return h.processStart(ctx, c, b, req, send)
		})
	case "process.Process/Connect":
		serveStream(w, r, func(ctx context.Context, c *rpcCall, req []byte, send func(any) error) error {
			return h.processConnect(ctx, c, b, req, send)
		})
	case "process.Process/List":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) { return h.processList(ctx, b) })
	case "process.Process/SendInput":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) { return h.processSendInput(ctx, b, req) })
	case "process.Process/SendSignal":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) {
			return h.processSendSignal(ctx, b, req)
		})
	case "process.Process/CloseStdin":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) {
			return h.processCloseStdin(ctx, b, req)
		})
	case "process.Process/Update":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) { return h.processUpdate(ctx, b, req) })
	case "process.Process/StreamInput":
		// A client stream: the Connect protocol sends it enveloped, and
		// neither fetch-based client can send one; reject it in the
		// stream's format.
		serveStream(w, r, func(ctx context.Context, c *rpcCall, req []byte, send func(any) error) error {
			return errorf(CodeUnimplemented, "process.Process/StreamInput is not supported; use SendInput")
		})
	case "filesystem.Filesystem/Stat":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) { return h.fsStat(ctx, c, b, req) })
	case "filesystem.Filesystem/ListDir":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) { return h.fsListDir(ctx, c, b, req) })
	case "filesystem.Filesystem/MakeDir":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) { return h.fsMakeDir(ctx, c, b, req) })
	case "filesystem.Filesystem/Move":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) { return h.fsMove(ctx, c, b, req) })
	case "filesystem.Filesystem/Remove":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) { return h.fsRemove(ctx, c, b, req) })
	case "filesystem.Filesystem/WatchDir":
		serveStream(w, r, func(ctx context.Context, c *rpcCall, req []byte, send func(any) error) error {
			return h.fsWatchDir(ctx, c, b, req, send)
		})
	case "filesystem.Filesystem/CreateWatcher":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) {
			return h.fsCreateWatcher(ctx, c, b, req)
		})
	case "filesystem.Filesystem/GetWatcherEvents":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) {
			return h.fsGetWatcherEvents(ctx, b, req)
		})
	case "filesystem.Filesystem/RemoveWatcher":
		serveUnary(w, r, func(ctx context.Context, c *rpcCall, req []byte) (any, error) { return h.fsRemoveWatcher(ctx, b, req) })
	default:
		writeUnaryError(w, errorf(CodeUnimplemented, "%s/%s is not implemented", svc, method))
	}
}

// sandboxUserKey carries, in an envd request's context, the name of the
// user the sandbox runs everything as (manager.Sandbox.UserName).
type sandboxUserKey struct{}

// checkUser refuses a user other than the sandbox's own, as envd refuses a
// user its template lacks (unauthenticated, "invalid username"). envd runs
// commands and file operations as any user of the template; airlock runs
// everything in a sandbox as one user: "user" (uid 1000 of the sandbox's
// own user namespace), or "root" (uid 0 of it) in a sandbox of an image or
// template that runs as root. RPCs name the user in HTTP Basic auth;
// /files in the username parameter.
func checkUser(r *http.Request, user string) *Error {
	own, _ := r.Context().Value(sandboxUserKey{}).(string)
	if own == "" {
		own = "user"
	}
	if user == "" || user == own {
		return nil
	}
	if user == "root" {
		return errorf(CodeUnauthenticated, "invalid username: 'root': user \"root\" is not available in this sandbox: it runs everything as %q (uid 1000 of its own user namespace; no root inside, and never the host's): leave user unset, or use a template or image that runs as root (its root is uid 0 of the sandbox's own user namespace)", own)
	}
	return errorf(CodeUnauthenticated, "invalid username: '%s': this sandbox runs everything as %q: leave user unset", user, own)
}

// rpcUser extracts the user named by an RPC's Authorization header.
func rpcUser(r *http.Request) *Error {
	a := r.Header.Get("Authorization")
	if a == "" {
		return nil
	}
	u, _, ok := r.BasicAuth()
	if !ok {
		return errorf(CodeUnauthenticated, "malformed Authorization header: want Basic with a user name")
	}
	return checkUser(r, u)
}

// hostRoute parses a host of the form PORT-SANDBOXID.Domain (with an
// optional :port of the listener).
func (h *Handler) hostRoute(host string) (id, port string, ok bool) {
	if h.cfg.Domain == "" {
		return "", "", false
	}
	if hp, _, err := net.SplitHostPort(host); err == nil {
		host = hp
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(h.cfg.Domain))
	if !ok {
		return "", "", false
	}
	port, id, ok = strings.Cut(label, "-")
	if !ok || strings.Contains(id, ".") || !strings.HasPrefix(id, "sb-") {
		return "", "", false
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "", false
	}
	return id, port, true
}
