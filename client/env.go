package client

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"
)

// Environment variables FromEnv reads.
const (
	// EnvURL names the server's base URL, e.g. http://127.0.0.1:7070.
	EnvURL = "AIRLOCK_URL"
	// EnvAPIKey names the API key (al_...); unset for a --no-auth server.
	EnvAPIKey = "AIRLOCK_API_KEY"
	// EnvTimeout names the client's overall limit per request, a Go
	// duration ("30s", "5m"); unset means none (each call's context rules).
	EnvTimeout = "AIRLOCK_TIMEOUT"
)

// ErrNoURL is returned by FromEnv when $AIRLOCK_URL is unset.
var ErrNoURL = errors.New("airlock: no server URL: set " + EnvURL + " (e.g. http://127.0.0.1:7070)")

// FromEnv returns a client configured from the environment: the server
// from $AIRLOCK_URL (required), the key from $AIRLOCK_API_KEY, and an
// overall per-request limit from $AIRLOCK_TIMEOUT. A malformed value is an
// error naming the variable; nothing is guessed.
func FromEnv() (*Client, error) {
	return Config{}.WithEnv().New()
}

// Config is what a client needs: the server, the key, and a limit on each
// request. Zero fields are unset.
type Config struct {
	URL    string
	APIKey string
	// Timeout bounds each request, streams included (0: no limit but the
	// caller's context).
	Timeout time.Duration
	// timeoutErr records a bad $AIRLOCK_TIMEOUT for New.
	timeoutErr error
}

// WithEnv fills the fields that are unset from $AIRLOCK_URL,
// $AIRLOCK_API_KEY and $AIRLOCK_TIMEOUT: fields already set (from flags)
// win over the environment.
func (c Config) WithEnv() Config {
	if c.URL == "" {
		c.URL = os.Getenv(EnvURL)
	}
	if c.APIKey == "" {
		c.APIKey = os.Getenv(EnvAPIKey)
	}
	if v := os.Getenv(EnvTimeout); c.Timeout == 0 && v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			c.timeoutErr = fmt.Errorf("airlock: $%s=%q: want a duration such as 30s or 5m", EnvTimeout, v)
		}
		c.Timeout = d
	}
	return c
}

// New checks the configuration and returns its client: the URL must be
// an absolute http or https URL without a query.
func (c Config) New() (*Client, error) {
	if c.timeoutErr != nil {
		return nil, c.timeoutErr
	}
	if c.URL == "" {
		return nil, ErrNoURL
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("airlock: server URL %q: want http://HOST:PORT or https://HOST:PORT", c.URL)
	}
	if u.User != nil {
		return nil, fmt.Errorf("airlock: server URL of %s: put the key in %s, not in the URL", u.Host, EnvAPIKey)
	}
	if strings.ContainsAny(c.APIKey, "\r\n") {
		return nil, errors.New("airlock: the API key holds a line break")
	}
	cl := New(c.URL, c.APIKey)
	cl.HTTP.Timeout = c.Timeout
	return cl, nil
}
