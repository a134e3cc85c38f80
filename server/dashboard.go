package server

import (
	"context"
	"net/http"

	"airlock/dashboard"
)

// dashboardRoutes serves the web UI (package dashboard) at / on the API's
// listener. Its session cookie authenticates API calls only together with
// the session's CSRF token (sessionKey).
func (s *Server) dashboardRoutes() error {
	d, err := dashboard.New(dashboard.Config{NoAuth: s.cfg.NoAuth, Authenticate: func(ctx context.Context, key string) (dashboard.KeyInfo, error) {
		k, err := s.cfg.Store.Authenticate(ctx, key)
		if err != nil {
			return dashboard.KeyInfo{}, err
		}
		return dashboard.KeyInfo{ID: k.ID, Name: k.Name, MaxSandboxes: k.MaxSandboxes, Limits: k.Limits}, nil
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
