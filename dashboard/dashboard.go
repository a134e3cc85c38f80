// Package dashboard serves airlock's web UI: static assets embedded in the
// binary (built from web/ by a pinned esbuild into dist/) and the login
// session that lets the browser call the /v1 API. The API key a user logs in
// with is held server-side; the browser gets an opaque session cookie
// (HttpOnly, SameSite=Strict, Secure over TLS) and a CSRF token it must echo
// in the X-Airlock-CSRF header on every API call. docs/dashboard.md and
// docs/RATIONALE.md describe the design.
package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
)

//go:embed dist
var dist embed.FS

// Names the browser and the API agree on.
const (
	// CookieName is the session cookie.
	CookieName = "airlock_session"
	// CSRFHeader carries the session's CSRF token on every API call a
	// session cookie authenticates (and marks dashboard requests as such).
	CSRFHeader = "X-Airlock-CSRF"
	// SessionTTL is how long a session lives after its last use.
	SessionTTL = 12 * time.Hour
	// MaxSessions caps live sessions; the least recently used goes first.
	MaxSessions = 1024
)

// CSP is the Content-Security-Policy of every dashboard response: scripts
// only from the server's own files (no inline script, no eval), no frames,
// no plugins, requests only to this origin. Styles allow 'unsafe-inline'
// because xterm.js injects <style> elements for its renderer (see
// docs/RATIONALE.md).
const CSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Config configures a Handler.
type Config struct {
	// Authenticate checks an API key and describes it; required unless
	// NoAuth.
	Authenticate func(ctx context.Context, key string) (KeyInfo, error)
	// NoAuth opens the dashboard without logging in (loopback --no-auth).
	NoAuth bool
	// FrameSrc, if set, is the CSP source list the page may frame (the
	// origins of sandbox pages, e.g. "http://*.relay.example:*", for the
	// desktop view); without it the page frames nothing.
	FrameSrc string
}

// KeyInfo is what the dashboard shows of the logged-in key (never its
// secret): its ID, name and quotas.
type KeyInfo struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	MaxSandboxes int    `json:"max_sandboxes"`
	// Limits are the key's own caps on each sandbox (store.KeyLimits).
	Limits any `json:"limits,omitempty"`
	// Admin keys see the Keys page (they may call /v1/keys).
	Admin bool `json:"admin,omitempty"`
}

// Handler serves the dashboard and its sessions.
type Handler struct {
	cfg    Config
	assets fs.FS
	// secret derives the CSRF token of a --no-auth browser session from
	// its cookie (noAuthToken); it never leaves the process.
	secret []byte

	mu       sync.Mutex
	sessions map[string]*session

	logins loginLimits // login attempts per client address
}

type session struct {
	key, csrf string
	info      KeyInfo
	used      time.Time
}

// New returns a dashboard handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Authenticate == nil && !cfg.NoAuth {
		return nil, errors.New("dashboard: Authenticate is required unless NoAuth")
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("dashboard: no randomness: %w", err)
	}
	return &Handler{cfg: cfg, assets: Assets(), secret: secret, sessions: map[string]*session{}}, nil
}

// Assets returns the embedded build (dist/).
func Assets() fs.FS {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic("dashboard: embedded dist missing: " + err.Error()) // a build error, not a runtime one
	}
	return sub
}

// Register adds the dashboard's routes to mux: GET / (the page), GET
// /ui/{file} (its assets) and the session endpoints under /ui/session.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { h.file(w, "index.html") })
	mux.HandleFunc("GET /ui/{file}", func(w http.ResponseWriter, r *http.Request) { h.file(w, r.PathValue("file")) })
	mux.HandleFunc("GET /ui/session", h.current)
	mux.HandleFunc("POST /ui/session", h.login)
	mux.HandleFunc("DELETE /ui/session", h.logout)
}

var types = map[string]string{".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
	".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}

func securityHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Security-Policy", CSP)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("Cache-Control", "no-store")
}

func (h *Handler) file(w http.ResponseWriter, name string) {
	securityHeaders(w)
	if h.cfg.FrameSrc != "" && name == "index.html" {
		w.Header().Set("Content-Security-Policy", CSP+"; frame-src "+h.cfg.FrameSrc)
	}
	ct, ok := types[path.Ext(name)]
	b, err := fs.ReadFile(h.assets, name)
	if !ok || err != nil {
		writeJSON(w, 404, map[string]any{"error": map[string]string{"code": "not_found", "message": "no such dashboard file"}})
		return
	}
	w.Header().Set("Content-Type", ct)
	w.Write(b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	securityHeaders(w)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func token() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("dashboard: no randomness: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// isWebSocket reports whether r is a WebSocket handshake, whose headers a
// page cannot choose (Upgrade is a forbidden header for fetch) and which a
// browser always sends with its page's Origin.
func isWebSocket(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && r.Header.Get("Origin") != ""
}

// SameOrigin reports whether r comes from a page of this server: a
// dashboard request carries CSRFHeader (which no cross-origin page can set
// without a CORS preflight this server never grants), or is a browser's
// WebSocket handshake (which cannot carry the header but always carries
// Origin); its Origin, if any, is this server's own, and the browser did
// not mark it as coming from another origin.
func SameOrigin(r *http.Request) bool {
	if r.Header.Get(CSRFHeader) == "" && !isWebSocket(r) {
		return false
	}
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	scheme := "http://"
	if isHTTPS(r) {
		scheme = "https://"
	}
	return o == scheme+r.Host
}

// isHTTPS reports whether the browser reached the server over TLS: its own
// TLS, or a TLS-terminating proxy in front that says so in
// X-Forwarded-Proto (a header no cross-origin page can set without a
// preflight, so trusting it only changes which scheme the Origin must
// have).
func isHTTPS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// ErrCSRF is returned for a session cookie without the session's CSRF
// token.
var ErrCSRF = errors.New("dashboard session without its " + CSRFHeader + " token (cross-site request?)")

// Key returns the API key of the session r's cookie names, if r carries
// one; ok is false without a cookie. A cookie is only honoured together
// with the session's CSRF token in CSRFHeader from a same-origin page, or
// on a WebSocket handshake whose Origin is this server's own (the terminal:
// browsers cannot add headers to a handshake, and the Origin check is the
// defence against cross-site WebSocket hijacking, RFC 6455 section 10.2).
func (h *Handler) Key(r *http.Request) (key string, ok bool, err error) {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return "", false, nil
	}
	s := h.lookup(c.Value)
	if s == nil {
		return "", true, errors.New("dashboard session expired or logged out")
	}
	if !SameOrigin(r) {
		return "", true, ErrCSRF
	}
	if isWebSocket(r) && r.Header.Get(CSRFHeader) == "" {
		return s.key, true, nil
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(CSRFHeader)), []byte(s.csrf)) != 1 {
		return "", true, ErrCSRF
	}
	return s.key, true, nil
}

func (h *Handler) lookup(id string) *session {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sessions[id]
	if s == nil {
		return nil
	}
	if time.Since(s.used) > SessionTTL {
		delete(h.sessions, id)
		return nil
	}
	s.used = time.Now()
	return s
}

// maxSessionID bounds a session cookie's value.
const maxSessionID = 128

// noAuthToken is the CSRF token of the --no-auth browser session sid: an
// HMAC of the cookie under the process's secret, so that only a page that
// can read GET /ui/session (a page of this origin, which the ports relay's
// sandboxed pages are not) learns it, and nothing is stored per session.
func (h *Handler) noAuthToken(sid string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte("airlock no-auth csrf\x00" + sid))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckBrowser vets a request a browser page sent to a --no-auth server
// (one with an Origin, or a Sec-Fetch-Site other than none): it must carry
// the browser session's cookie and that session's CSRF token (from GET
// /ui/session), or be a WebSocket handshake with the cookie and this
// server's own Origin. A page of another origin, or a sandbox's page shown
// by the ports relay (an opaque origin: CSP sandbox), has neither.
func (h *Handler) CheckBrowser(r *http.Request) error {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" || len(c.Value) > maxSessionID {
		return ErrCSRF
	}
	if !SameOrigin(r) {
		return ErrCSRF
	}
	if isWebSocket(r) && r.Header.Get(CSRFHeader) == "" {
		return nil
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(CSRFHeader)), []byte(h.noAuthToken(c.Value))) != 1 {
		return ErrCSRF
	}
	return nil
}

// current answers GET /ui/session: whether the browser is logged in, and
// its CSRF token (readable only by same-origin script). Without
// authentication the browser gets a session cookie here, and the token
// bound to it.
func (h *Handler) current(w http.ResponseWriter, r *http.Request) {
	if h.cfg.NoAuth {
		sid := ""
		if c, err := r.Cookie(CookieName); err == nil && c.Value != "" && len(c.Value) <= maxSessionID {
			sid = c.Value
		} else {
			sid = token()
			http.SetCookie(w, &http.Cookie{Name: CookieName, Value: sid, Path: "/", HttpOnly: true,
				SameSite: http.SameSiteStrictMode, Secure: isHTTPS(r), MaxAge: int(SessionTTL / time.Second)})
		}
		writeJSON(w, 200, map[string]any{"authenticated": true, "no_auth": true, "csrf": h.noAuthToken(sid)})
		return
	}
	if c, err := r.Cookie(CookieName); err == nil {
		if s := h.lookup(c.Value); s != nil {
			// The key is checked again: a revoked key's session ends here
			// (the page shows the login form instead of failing every
			// call), and the info shown is the key's current one.
			info, err := h.cfg.Authenticate(r.Context(), s.key)
			if err != nil {
				h.drop(c.Value)
				writeJSON(w, 200, map[string]any{"authenticated": false})
				return
			}
			h.mu.Lock()
			s.info = info
			h.mu.Unlock()
			writeJSON(w, 200, map[string]any{"authenticated": true, "key_id": info.ID, "key": info, "csrf": s.csrf})
			return
		}
	}
	writeJSON(w, 200, map[string]any{"authenticated": false})
}

// login answers POST /ui/session {"key": "al_..."}: it checks the key and
// sets the session cookie.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if !SameOrigin(r) {
		fail(w, 403, "forbidden", "log in from the dashboard page (missing "+CSRFHeader+" or cross-origin)")
		return
	}
	if h.cfg.NoAuth {
		fail(w, 400, "bad_request", "this server runs without authentication; no login needed")
		return
	}
	if wait := h.logins.take(clientAddr(r)); wait > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		fail(w, 429, "rate_limited", "too many failed logins from this address; retry after the time in Retry-After")
		return
	}
	var body struct {
		Key string `json:"key"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Key == "" {
		fail(w, 400, "bad_request", "body must be {\"key\": \"al_...\"}")
		return
	}
	info, err := h.cfg.Authenticate(r.Context(), body.Key)
	if err != nil {
		fail(w, 401, "unauthorized", "invalid or revoked API key")
		return
	}
	s := &session{key: body.Key, info: info, csrf: token(), used: time.Now()}
	sid := token()
	h.mu.Lock()
	if len(h.sessions) >= MaxSessions {
		var oldest string
		for k, v := range h.sessions {
			if oldest == "" || v.used.Before(h.sessions[oldest].used) {
				oldest = k
			}
		}
		delete(h.sessions, oldest)
	}
	h.sessions[sid] = s
	h.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: sid, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: isHTTPS(r), MaxAge: int(SessionTTL / time.Second)})
	writeJSON(w, 200, map[string]any{"authenticated": true, "key_id": info.ID, "key": info, "csrf": s.csrf})
}

// drop ends session id.
func (h *Handler) drop(id string) {
	h.mu.Lock()
	delete(h.sessions, id)
	h.mu.Unlock()
}

// logout answers DELETE /ui/session.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if _, _, err := h.Key(r); err != nil {
		fail(w, 403, "forbidden", err.Error())
		return
	}
	if c, err := r.Cookie(CookieName); err == nil {
		h.drop(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: isHTTPS(r), MaxAge: -1})
	writeJSON(w, 200, map[string]any{"authenticated": false})
}
