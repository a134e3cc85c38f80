package client

import (
	"context"
	"net/url"
	"time"
)

// KeyLimits are an API key's own ceilings on each of its sandboxes (0: no
// cap of the key's own; the server's apply).
type KeyLimits struct {
	MemoryBytes    int64   `json:"memory_bytes,omitempty"`
	CPUs           float64 `json:"cpus,omitempty"`
	Pids           int64   `json:"pids,omitempty"`
	DiskBytes      int64   `json:"disk_bytes,omitempty"`
	TimeoutSeconds int64   `json:"timeout_s,omitempty"`
}

// Key is an API key as the admin endpoints show it (never its secret).
type Key struct {
	ID           string     `json:"id"`
	Name         string     `json:"name"`
	CreatedAt    time.Time  `json:"created_at"`
	RevokedAt    *time.Time `json:"revoked_at,omitempty"`
	MaxSandboxes int        `json:"max_sandboxes"`
	Limits       KeyLimits  `json:"limits"`
	Admin        bool       `json:"admin"`
	// LastUsedAt is the key's last use, to within a minute (nil: never).
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

// CreateKeyRequest is the body of POST /v1/keys.
type CreateKeyRequest struct {
	Name         string    `json:"name"`
	MaxSandboxes int       `json:"max_sandboxes,omitempty"`
	Limits       KeyLimits `json:"limits,omitzero"`
	Admin        bool      `json:"admin,omitempty"`
}

// CreatedKey is a new key with its secret, which the server shows once.
type CreatedKey struct {
	Key Key `json:"key"`
	// Secret is the key, "al_...".
	Secret string `json:"secret"`
	// E2BSecret is the same key in the form E2B SDKs accept, "e2b_...".
	E2BSecret string `json:"e2b_secret"`
}

// Keys lists every API key, revoked ones included (an admin key only).
func (c *Client) Keys(ctx context.Context) ([]Key, error) {
	var out struct {
		Keys []Key `json:"keys"`
	}
	return out.Keys, c.call(ctx, "GET", "/v1/keys", nil, nil, &out)
}

// CreateKey creates an API key (an admin key only).
func (c *Client) CreateKey(ctx context.Context, req CreateKeyRequest) (*CreatedKey, error) {
	var out CreatedKey
	return &out, c.call(ctx, "POST", "/v1/keys", nil, req, &out)
}

// RevokeKey revokes an API key (an admin key only); the server refuses the
// last live admin key.
func (c *Client) RevokeKey(ctx context.Context, id string) (*Key, error) {
	var out Key
	return &out, c.call(ctx, "DELETE", "/v1/keys/"+url.PathEscape(id), nil, nil, &out)
}

// SetKeyLimits replaces a live key's own ceilings (an admin key only).
func (c *Client) SetKeyLimits(ctx context.Context, id string, maxSandboxes int, lim KeyLimits) (*Key, error) {
	var out Key
	body := struct {
		MaxSandboxes int       `json:"max_sandboxes"`
		Limits       KeyLimits `json:"limits"`
	}{maxSandboxes, lim}
	return &out, c.call(ctx, "PUT", "/v1/keys/"+url.PathEscape(id)+"/limits", nil, body, &out)
}
