package server

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/airlock-dev/airlock/e2b"
	"github.com/airlock-dev/airlock/store"
)

// Audit actions of the key endpoints. Every change an admin key makes is
// recorded: a limits change before it takes effect, a create right after
// (the record names the new key; a key whose record cannot be written is
// revoked at once), a revocation right after (its record is retried until
// written: a revocation is never held back). A non-admin key's attempt is
// recorded as ActionKeyDenied. No record carries a secret.
const (
	ActionKeyCreate = "key.create"
	ActionKeyRevoke = "key.revoke"
	ActionKeyLimits = "key.limits"
	ActionKeyDenied = "key.denied"
)

// maxKeyName bounds a key's name.
const maxKeyName = 200

// keyRoutes registers the key endpoints, which only admin keys may call
// (airlock keys create --admin).
func (s *Server) keyRoutes(authed func(pattern string, h handler)) {
	authed("GET /v1/keys", s.admin(s.listKeys))
	authed("POST /v1/keys", s.admin(s.createKey))
	authed("GET /v1/keys/{id}", s.admin(s.getKey))
	authed("DELETE /v1/keys/{id}", s.admin(s.revokeKey))
	authed("PUT /v1/keys/{id}/limits", s.admin(s.setKeyLimits))
}

// KeyView is an API key as the key endpoints show it: never its secret
// (which is not stored) nor its hash.
type KeyView struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// MaxSandboxes caps the key's running sandboxes; 0: none of its own.
	MaxSandboxes int `json:"max_sandboxes"`
	// Limits are the key's own ceilings on each sandbox.
	Limits store.KeyLimits `json:"limits"`
	// Admin keys may call these endpoints.
	Admin bool `json:"admin"`
	// LastUsedAt is the key's last authentication, to within a minute;
	// absent if never (or not since this was tracked).
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

func viewKey(k *store.APIKey) KeyView {
	return KeyView{ID: k.ID, Name: k.Name, CreatedAt: k.CreatedAt, RevokedAt: k.RevokedAt,
		MaxSandboxes: k.MaxSandboxes, Limits: k.Limits, Admin: k.Admin, LastUsedAt: k.LastUsedAt}
}

// admin lets only admin keys through to h. Others get a 403 and an audit
// record of the attempt; a server without authentication has no keys to
// manage.
func (s *Server) admin(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.cfg.NoAuth || s.cfg.Store == nil {
			return errf(403, "forbidden", "this server runs without authentication: it has no API keys to manage")
		}
		k := caller(r)
		if !k.admin {
			s.m.Audit(r.Context(), k.id, "", ActionKeyDenied, map[string]any{"route": r.Pattern})
			return errf(403, "forbidden", "only an admin API key may manage keys (airlock keys create --admin)")
		}
		return h(w, r)
	}
}

// auditKey records an admin's action on a key before it is answered; an
// error means the action must not be reported done (or, before it, not
// done at all).
func (s *Server) auditKey(r *http.Request, keyID, action string, detail map[string]any) error {
	detail["key"] = keyID
	if err := s.m.AuditFirst(r.Context(), caller(r).id, "", action, detail); err != nil {
		return err
	}
	return nil
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r); err != nil {
		return err
	}
	keys, err := s.cfg.Store.ListKeys(r.Context())
	if err != nil {
		return err
	}
	out := make([]KeyView, len(keys))
	for i, k := range keys {
		out[i] = viewKey(k)
	}
	writeJSON(w, 200, map[string]any{"keys": out})
	return nil
}

func (s *Server) getKey(w http.ResponseWriter, r *http.Request) error {
	k, err := s.cfg.Store.GetKey(r.Context(), r.PathValue("id"))
	if err != nil {
		return keyErr(err)
	}
	writeJSON(w, 200, viewKey(k))
	return nil
}

// CreateKeyRequest is the body of POST /v1/keys.
type CreateKeyRequest struct {
	Name         string          `json:"name"`
	MaxSandboxes int             `json:"max_sandboxes,omitempty"`
	Limits       store.KeyLimits `json:"limits,omitzero"`
	// Admin makes an admin key; only an admin key can ask for one.
	Admin bool `json:"admin,omitempty"`
}

// CreateKeyResponse answers POST /v1/keys: the only response that ever
// holds the key's secret.
type CreateKeyResponse struct {
	Key KeyView `json:"key"`
	// Secret is the key ("al_..."); it is not stored and is shown once.
	Secret string `json:"secret"`
	// E2BSecret is the same key in the form E2B SDKs accept ("e2b_...").
	E2BSecret string `json:"e2b_secret"`
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) error {
	var req CreateKeyRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if err := checkKeyName(req.Name); err != nil {
		return err
	}
	if err := checkKeyLimits(req.MaxSandboxes, req.Limits); err != nil {
		return err
	}
	k, secret, err := s.cfg.Store.CreateKeySpec(r.Context(), store.KeySpec{Name: req.Name, MaxSandboxes: req.MaxSandboxes,
		Limits: req.Limits, Admin: req.Admin})
	if err != nil {
		return err
	}
	if err := s.auditKey(r, k.ID, ActionKeyCreate, map[string]any{"name": k.Name, "admin": k.Admin,
		"max_sandboxes": k.MaxSandboxes, "limits": k.Limits}); err != nil {
		// Fail closed: no key is handed out that the log does not name.
		if rerr := s.cfg.Store.RevokeKey(r.Context(), k.ID); rerr != nil {
			return fmt.Errorf("key %s created but not audited, and revoking it failed (revoke it by hand): %w", k.ID, errors.Join(err, rerr))
		}
		return fmt.Errorf("key %s revoked at once: %w", k.ID, err)
	}
	e2bSecret, err := e2b.E2BKey(secret)
	if err != nil {
		return err
	}
	writeJSON(w, 201, CreateKeyResponse{Key: viewKey(k), Secret: secret, E2BSecret: e2bSecret})
	return nil
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	k, err := s.cfg.Store.GetKey(r.Context(), id)
	if err != nil {
		return keyErr(err)
	}
	if k.RevokedAt == nil {
		// Revoke first (the store refuses the last admin key, atomically),
		// then record it: a revocation is never held back by the log,
		// whose write is retried until it succeeds.
		if err := s.cfg.Store.RevokeKey(r.Context(), id); err != nil {
			return keyErr(err)
		}
		defer s.cutKey(id) // after the answer: an admin may revoke its own key
		s.m.Audit(r.Context(), caller(r).id, "", ActionKeyRevoke, map[string]any{"key": id, "name": k.Name, "admin": k.Admin})
	}
	if k, err = s.cfg.Store.GetKey(r.Context(), id); err != nil {
		return keyErr(err)
	}
	writeJSON(w, 200, viewKey(k))
	return nil
}

// KeyLimitsRequest is the body of PUT /v1/keys/{id}/limits: the key's own
// ceilings, replaced whole (a field left out is no cap of its own).
type KeyLimitsRequest struct {
	MaxSandboxes int             `json:"max_sandboxes"`
	Limits       store.KeyLimits `json:"limits"`
}

func (s *Server) setKeyLimits(w http.ResponseWriter, r *http.Request) error {
	var req KeyLimitsRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if err := checkKeyLimits(req.MaxSandboxes, req.Limits); err != nil {
		return err
	}
	id := r.PathValue("id")
	k, err := s.cfg.Store.GetKey(r.Context(), id)
	if err != nil {
		return keyErr(err)
	}
	if k.RevokedAt != nil {
		return errf(409, "conflict", "key %s is revoked", id)
	}
	if err := s.auditKey(r, id, ActionKeyLimits, map[string]any{"max_sandboxes": req.MaxSandboxes, "limits": req.Limits,
		"was": map[string]any{"max_sandboxes": k.MaxSandboxes, "limits": k.Limits}}); err != nil {
		return err
	}
	k, err = s.cfg.Store.SetKeyLimits(r.Context(), id, req.MaxSandboxes, req.Limits)
	if err != nil {
		return keyErr(err)
	}
	writeJSON(w, 200, viewKey(k))
	return nil
}

// checkKeyName refuses an empty, long or control-character name.
func checkKeyName(name string) error {
	if strings.TrimSpace(name) == "" || len(name) > maxKeyName {
		return errf(400, "bad_request", "name must be 1 to %d bytes", maxKeyName)
	}
	if strings.IndexFunc(name, unicode.IsControl) >= 0 {
		return errf(400, "bad_request", "name must not hold control characters")
	}
	return nil
}

// checkKeyLimits refuses negative caps.
func checkKeyLimits(maxSandboxes int, l store.KeyLimits) error {
	if maxSandboxes < 0 || l.MemoryBytes < 0 || l.CPUs < 0 || l.Pids < 0 || l.DiskBytes < 0 || l.TimeoutSeconds < 0 {
		return errf(400, "bad_request", "limits must not be negative (0: no cap of the key's own)")
	}
	return nil
}

// keyErr maps the store's key errors to API errors.
func keyErr(err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return errf(404, "not_found", "no such key")
	case errors.Is(err, store.ErrLastAdmin):
		return errf(409, "conflict", "%s", store.ErrLastAdmin.Error())
	}
	return err
}
