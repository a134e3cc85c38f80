package server

import (
	"net/http/httptest"
	"testing"
)

// TestBrowserGuard: a web page cannot drive a local server: cross-origin
// requests are refused, and without auth so is a non-loopback Host (DNS
// rebinding).
func TestBrowserGuard(t *testing.T) {
	cases := []struct {
		host, origin string
		noAuth       bool
		refused      bool
	}{
		{"127.0.0.1:7070", "", true, false},
		{"localhost:7070", "", true, false},
		{"[::1]:7070", "", true, false},
		{"evil.example:7070", "", true, true},
		{"127.0.0.1:7070", "http://evil.example", true, true},
		{"127.0.0.1:7070", "http://evil.example", false, true},
		{"airlock.internal:7070", "", false, false},
	}
	for _, c := range cases {
		r := httptest.NewRequest("POST", "http://"+c.host+"/v1/sandboxes", nil)
		r.Host = c.host
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if got := browserGuard(r, c.noAuth) != ""; got != c.refused {
			t.Errorf("host %q origin %q noAuth %v: refused=%v, want %v", c.host, c.origin, c.noAuth, got, c.refused)
		}
	}
}
