// Package portlink makes capability links to a port of a sandbox, each
// on an origin of its own: http(s)://l-ID.DOMAIN/SECRET/... (ID random,
// SECRET a 128-bit random token). The dashboard shows a sandbox's desktop
// (noVNC) through one in a frame: the sandbox's page then runs on an
// origin that is neither the dashboard's (it cannot script it or use its
// session) nor another link's (one sandbox's page cannot reach another's).
// The secret is in the path, not the host name, so that it does not leave
// in DNS queries; it authorizes one port of one sandbox for one key, until
// the link expires.
package portlink

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base32"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// Link is one capability link.
type Link struct {
	// ID is the host label's random part (l-ID.DOMAIN).
	ID string
	// Secret is the first path segment.
	Secret string
	// Owner is the API key the link acts for ("" without auth).
	Owner string
	// Sandbox and Port are what it reaches.
	Sandbox string
	Port    int
	// Expires is when it stops working.
	Expires time.Time
}

// MaxLinks caps the live links of a Links; the one expiring first goes.
const MaxLinks = 4096

// Links holds the live links of one server (in memory: a restart ends
// them; a viewer asks for a new one).
type Links struct {
	// Domain is the DNS name under which every l-ID label resolves to the
	// server (e.g. relay.example.com, or localhost).
	Domain string

	mu    sync.Mutex
	links map[string]*Link
}

// New returns the links of domain.
func New(domain string) (*Links, error) {
	domain = strings.ToLower(strings.TrimSuffix(domain, "."))
	if domain == "" || strings.ContainsAny(domain, "/:@ ") {
		return nil, fmt.Errorf("portlink: bad domain %q: give a DNS name such as relay.example.com", domain)
	}
	return &Links{Domain: domain, links: map[string]*Link{}}, nil
}

var enc = base32.StdEncoding.WithPadding(base32.NoPadding)

func token() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("portlink: no randomness: %w", err)
	}
	return strings.ToLower(enc.EncodeToString(b[:])), nil
}

// Mint makes a link for owner to port of sandbox, valid for ttl.
func (l *Links) Mint(owner, sandbox string, port int, ttl time.Duration) (*Link, error) {
	id, err := token()
	if err != nil {
		return nil, err
	}
	secret, err := token()
	if err != nil {
		return nil, err
	}
	k := &Link{ID: id, Secret: secret, Owner: owner, Sandbox: sandbox, Port: port, Expires: time.Now().Add(ttl)}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for id, o := range l.links {
		if now.After(o.Expires) {
			delete(l.links, id)
		}
	}
	for len(l.links) >= MaxLinks {
		var first *Link
		for _, o := range l.links {
			if first == nil || o.Expires.Before(first.Expires) {
				first = o
			}
		}
		delete(l.links, first.ID)
	}
	l.links[id] = k
	c := *k
	return &c, nil
}

// Host is the link's host name (without port).
func (l *Links) Host(k *Link) string { return "l-" + k.ID + "." + l.Domain }

// Match reports whether host (a request's Host, port allowed) is a link's
// host name under Domain.
func (l *Links) Match(host string) bool {
	_, ok := l.id(host)
	return ok
}

func (l *Links) id(host string) (string, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+l.Domain)
	if !ok {
		return "", false
	}
	id, ok := strings.CutPrefix(label, "l-")
	return id, ok && id != "" && !strings.Contains(id, ".")
}

// ErrNoLink is the error of a request no live link authorizes.
var ErrNoLink = errors.New("no such link (expired, or never made): ask for a new one")

// Resolve finds the link a request to host with path authorizes and
// returns it with the path left for the sandbox's server ("/" at least).
func (l *Links) Resolve(host, path string) (*Link, string, error) {
	id, ok := l.id(host)
	if !ok {
		return nil, "", ErrNoLink
	}
	secret, rest, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	l.mu.Lock()
	k := l.links[id]
	l.mu.Unlock()
	if k == nil || subtle.ConstantTimeCompare([]byte(secret), []byte(k.Secret)) != 1 {
		return nil, "", ErrNoLink
	}
	if time.Now().After(k.Expires) {
		l.mu.Lock()
		delete(l.links, id)
		l.mu.Unlock()
		return nil, "", ErrNoLink
	}
	c := *k
	return &c, "/" + rest, nil
}
