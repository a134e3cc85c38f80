package server

import (
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/airlock-dev/airlock/computer"
	"github.com/airlock-dev/airlock/portlink"
	"github.com/airlock-dev/airlock/portproxy"
	"github.com/airlock-dev/airlock/store"
)

// StreamLinkTTL is how long a link (a desktop stream's too) works.
const StreamLinkTTL = time.Hour

// StreamResponse is the body of POST /v1/sandboxes/{id}/stream.
type StreamResponse struct {
	// ViewURL is noVNC's page, read-only (view_only): watch the desktop.
	ViewURL string `json:"view_url"`
	// ControlURL is the same page taking input: take the desktop over.
	ControlURL string `json:"control_url"`
	// ExpiresAt is when both links stop working.
	ExpiresAt time.Time `json:"expires_at"`
}

// stream starts a desktop sandbox's live stream (x11vnc and noVNC inside
// it, computer.StartStream) and answers links to noVNC on an origin of
// their own (package portlink, --relay-domain): never the API's, so the
// sandbox's page cannot script the dashboard that frames it.
func (s *Server) stream(w http.ResponseWriter, r *http.Request) error {
	if s.links == nil {
		return errNoRelayDomain
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	k := caller(r)
	// Recorded first (it may start the desktop, as any computer-use
	// action does); the processes of the stream are then commands like
	// any other: audited and held by the approval policy's exec rules.
	if err := s.m.AuditFirst(r.Context(), k.id, sb.ID, "computer.stream", map[string]any{"via": "api"}); err != nil {
		return err
	}
	if err := computer.StartStream(r.Context(), sb, func(argv []string) error {
		return s.m.AuditFirst(r.Context(), k.id, sb.ID, store.ActionExec, map[string]any{"argv": argv, "background": true, "via": "stream"})
	}); err != nil {
		return computerErr(err)
	}
	base, link, err := s.mintLink(r, sb.ID, computer.NoVNCPort)
	if err != nil {
		return err
	}
	page := func(viewOnly string) string {
		q := url.Values{"autoconnect": {"1"}, "reconnect": {"1"}, "resize": {"scale"}, "view_only": {viewOnly},
			"path": {link.Secret + "/websockify"}}
		return base + "vnc.html?" + q.Encode()
	}
	writeJSON(w, 200, StreamResponse{ViewURL: page("1"), ControlURL: page("0"), ExpiresAt: link.Expires.UTC()})
	return nil
}

// LinkRequest is the body of POST /v1/sandboxes/{id}/links.
type LinkRequest struct {
	// Port is the sandbox's port (on its loopback) the link reaches.
	Port int `json:"port"`
}

// LinkResponse is the answer of POST /v1/sandboxes/{id}/links.
type LinkResponse struct {
	// URL is the link: the port's root on the link's own origin.
	URL string `json:"url"`
	// ExpiresAt is when it stops working.
	ExpiresAt time.Time `json:"expires_at"`
}

// link answers a capability link to a port of a sandbox on an origin of
// its own (package portlink): for a browser, unlike the ports relay on
// the API's origin, which serves sandboxed documents.
func (s *Server) link(w http.ResponseWriter, r *http.Request) error {
	if s.links == nil {
		return errNoRelayDomain
	}
	var req LinkRequest
	if err := decode(w, r, &req); err != nil {
		return errf(400, "bad_request", "%v", err)
	}
	if req.Port < 1 || req.Port > 65535 {
		return errf(400, "bad_request", "bad port %d: give a number from 1 to 65535", req.Port)
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	base, link, err := s.mintLink(r, sb.ID, req.Port)
	if err != nil {
		return err
	}
	writeJSON(w, 200, LinkResponse{URL: base, ExpiresAt: link.Expires.UTC()})
	return nil
}

var errNoRelayDomain = errf(409, "no_relay_domain", "this server has no origin for sandbox pages: start it with --relay-domain DOMAIN (*.DOMAIN must reach it)")

// mintLink makes a link to port of sandbox for the caller, audited
// (sandbox.link) before it exists, and returns its URL (ending in /).
func (s *Server) mintLink(r *http.Request, sandbox string, port int) (string, *portlink.Link, error) {
	k := caller(r)
	expires := time.Now().Add(StreamLinkTTL).UTC()
	if err := s.m.AuditFirst(r.Context(), k.id, sandbox, "sandbox.link", map[string]any{"port": port, "expires_at": expires}); err != nil {
		return "", nil, err
	}
	link, err := s.links.Mint(k.id, sandbox, port, StreamLinkTTL)
	if err != nil {
		return "", nil, err
	}
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	host := s.links.Host(link)
	if _, p, err := net.SplitHostPort(r.Host); err == nil {
		host = net.JoinHostPort(host, p)
	}
	return scheme + "://" + host + "/" + link.Secret + "/", link, nil
}

// serveLink relays a request addressed to a link's host (portlink) to its
// sandbox's port. The link's secret authorizes it, for the key that made
// it while that key is valid and the sandbox is its; no cookie, no
// credential and no Referer (which holds the secret) reaches the sandbox.
// A page of another origin may not use a link (Origin, when sent, must be
// the link's own).
func (s *Server) serveLink(w http.ResponseWriter, r *http.Request) {
	link, rest, err := s.links.Resolve(r.Host, r.URL.Path)
	if err != nil {
		writeError(w, http.StatusNotFound, "not_found", err.Error())
		return
	}
	if o := r.Header.Get("Origin"); o != "" && o != "http://"+r.Host && o != "https://"+r.Host {
		writeError(w, http.StatusForbidden, "forbidden", "a link answers its own origin's pages only, not "+o)
		return
	}
	if !s.cfg.NoAuth {
		key, err := s.cfg.Store.GetKey(r.Context(), link.Owner)
		if err != nil || key.RevokedAt != nil {
			writeError(w, http.StatusForbidden, "forbidden", "the key that made this link is no longer valid")
			return
		}
	}
	sb, err := s.m.Lookup(link.Owner, link.Sandbox)
	if err != nil {
		writeError(w, http.StatusNotFound, "not_found", "the link's sandbox is gone: "+err.Error())
		return
	}
	portproxy.Serve(w, r, portproxy.Request{Agent: sb.Agent(), Port: link.Port, Path: rest,
		Drop: []string{"Cookie", "Referer"},
		Fail: func(w http.ResponseWriter, err error) {
			writeError(w, http.StatusBadGateway, "port_unreachable", portproxy.Describe(link.Port, err))
		}})
}

// relayRoutes sets up the links of Config.RelayDomain.
func (s *Server) relayRoutes() error {
	if s.cfg.RelayDomain == "" {
		return nil
	}
	l, err := portlink.New(s.cfg.RelayDomain)
	if err != nil {
		return err
	}
	s.links = l
	return nil
}
