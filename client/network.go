package client

import (
	"context"
	"net/url"
	"strconv"
	"time"
)

// Network is a sandbox's network policy (docs/network.md).
type Network struct {
	// Mode is "none" (the default), "allowlist" or "open".
	Mode string `json:"mode"`
	// Allow and Deny list names ("pypi.org"), wildcards
	// ("*.githubusercontent.com"), IPs and CIDR blocks, each with an
	// optional ":port". Deny wins.
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// Secret is a header the egress proxy adds to requests for Host, so that
// the sandbox can use a credential it never holds.
type Secret struct {
	// Host is a name, *.wildcard or IP, with an optional ":port".
	Host string `json:"host"`
	// Header is the header name, e.g. "Authorization".
	Header string `json:"header"`
	// Value is the header value; it never enters the sandbox.
	Value string `json:"value"`
}

// String describes s without its value.
func (s Secret) String() string {
	return "Secret{Host:" + s.Host + " Header:" + s.Header + " Value:[redacted]}"
}

// SecretRef names an injected header without its value.
type SecretRef struct {
	Host   string `json:"host"`
	Header string `json:"header"`
}

// NetworkInfo is a sandbox's network policy and proxy state.
type NetworkInfo struct {
	Mode    string      `json:"mode"`
	Allow   []string    `json:"allow"`
	Deny    []string    `json:"deny"`
	Secrets []SecretRef `json:"secrets,omitempty"`
	// SecretsLost is true after a server restart: secret values are held
	// in memory only and are no longer injected.
	SecretsLost bool `json:"secrets_lost,omitempty"`
	// Listening says whether the proxy listens inside the sandbox.
	Listening bool `json:"listening"`
}

// Connection is one entry of a sandbox's network log.
type Connection struct {
	Time       time.Time `json:"time"`
	Host       string    `json:"host"`
	Port       int       `json:"port"`
	Allowed    bool      `json:"allowed"`
	Reason     string    `json:"reason"`
	BytesUp    int64     `json:"bytes_up"`
	BytesDown  int64     `json:"bytes_down"`
	DurationMS int64     `json:"duration_ms"`
}

// Network returns a sandbox's network policy.
func (c *Client) Network(ctx context.Context, id string) (*NetworkInfo, error) {
	var out NetworkInfo
	return &out, c.call(ctx, "GET", sbPath(id, "/network"), nil, nil, &out)
}

// SetNetwork replaces a running sandbox's network policy; the next
// connection is judged by it.
func (c *Client) SetNetwork(ctx context.Context, id string, n Network) (*NetworkInfo, error) {
	var out NetworkInfo
	return &out, c.call(ctx, "PUT", sbPath(id, "/network"), nil, n, &out)
}

// NetworkLog returns the newest limit entries (0: the server's default of
// 1000) of a sandbox's network log, newest first.
func (c *Client) NetworkLog(ctx context.Context, id string, limit int) ([]Connection, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out struct {
		Connections []Connection `json:"connections"`
	}
	return out.Connections, c.call(ctx, "GET", sbPath(id, "/network/log"), q, nil, &out)
}
