package server

import (
	"context"
	"net/http"
	"strings"

	"github.com/airlock-dev/airlock/dashboard"
)

// dashboardRoutes serves the web UI (package dashboard) at / on the API's
// listener. Its session cookie authenticates API calls only together with
// the session's CSRF token (sessionKey).
func (s *Server) dashboardRoutes() error {
	frames := ""
	if s.links != nil {
		// The desktop view frames noVNC on its link's origin (stream.go).
		frames = "http://*." + s.links.Domain + ":* https://*." + s.links.Domain + ":*"
	}
	d, err := dashboard.New(dashboard.Config{NoAuth: s.cfg.NoAuth, FrameSrc: frames, Authenticate: func(ctx context.Context, key string) (dashboard.KeyInfo, error) {
		k, err := s.cfg.Store.Authenticate(ctx, key)
		if err != nil {
			return dashboard.KeyInfo{}, err
		}
		return dashboard.KeyInfo{ID: k.ID, Name: k.Name, MaxSandboxes: k.MaxSandboxes, Limits: k.Limits, Admin: k.Admin}, nil
	}})
	if err != nil {
		return err
	}
	s.dash = d
	d.Register(s.mux)
	return nil
}

// sessionKey returns the API key of the dashboard session r carries, if
// any (ok false without a session cookie); an error for a cookie without
// its CSRF token or an expired session. The session cookie is removed
// from r once read, so no handler passes it on (the ports relay forwards
// a request's cookies to the sandbox).
func (s *Server) sessionKey(r *http.Request) (key string, ok bool, err error) {
	if s.dash == nil {
		return "", false, nil
	}
	defer dropSessionCookie(r)
	if r.Header.Get("Authorization") != "" {
		return "", false, nil
	}
	return s.dash.Key(r)
}

// dropSessionCookie removes the dashboard's session cookie from r's
// Cookie header, keeping any other cookie.
func dropSessionCookie(r *http.Request) {
	if _, err := r.Cookie(dashboard.CookieName); err != nil {
		return
	}
	cs := r.Cookies()
	r.Header.Del("Cookie")
	for _, c := range cs {
		if c.Name != dashboard.CookieName {
			r.AddCookie(c)
		}
	}
}

// fromPage reports whether a browser page sent r (rather than a program,
// or the user typing a URL): it has an Origin, or a Sec-Fetch-Site other
// than none.
func fromPage(r *http.Request) bool {
	site := r.Header.Get("Sec-Fetch-Site")
	return r.Header.Get("Origin") != "" || (site != "" && site != "none")
}

// pageGuard refuses, on a --no-auth server, what a browser page sends to
// the API without the browser session's CSRF token (dashboard
// CheckBrowser): only the dashboard's own pages, which read it from GET
// /ui/session, have it. A sandbox's page shown by the ports relay is a
// sandboxed document of an opaque origin and cannot read it (nor does the
// browser send it the session cookie). The dashboard's own routes and the
// relays (which pass no credential to the sandbox) are not API calls. It
// returns the reason, or "" to let r through.
func (s *Server) pageGuard(r *http.Request) string {
	if !s.cfg.NoAuth || s.dash == nil || !fromPage(r) {
		return ""
	}
	if r.URL.Path == "/" || strings.HasPrefix(r.URL.Path, "/ui/") || s.e2b.HostRouted(r) {
		return ""
	}
	if _, p := s.mux.Handler(r); p == portsPattern {
		return ""
	}
	if err := s.dash.CheckBrowser(r); err != nil {
		return "a browser page may call this server without authentication only with the dashboard session's " +
			dashboard.CSRFHeader + " token: " + err.Error()
	}
	return ""
}
