package dashboard

import (
	"crypto/tls"
	"net/http/httptest"
	"testing"
)

// TestSameOrigin: only the dashboard's own pages pass: the CSRF header (or
// a browser's WebSocket handshake) and, if present, this server's Origin
// and Sec-Fetch-Site same-origin.
func TestSameOrigin(t *testing.T) {
	cases := []struct {
		name                 string
		method, csrf, origin string
		site, upgrade        string
		tls, proxy           bool
		want                 bool
	}{
		{"header, no origin", "GET", "t", "", "", "", false, false, true},
		{"header, own origin", "POST", "t", "http://srv:7070", "same-origin", "", false, false, true},
		{"no header", "POST", "", "http://srv:7070", "", "", false, false, false},
		{"header, other origin", "POST", "t", "http://evil.example", "", "", false, false, false},
		{"header, other port", "POST", "t", "http://srv:7071", "", "", false, false, false},
		{"header, cross-site fetch", "GET", "t", "", "cross-site", "", false, false, false},
		{"header, same-site fetch", "GET", "t", "", "same-site", "", false, false, false},
		{"header, http origin on TLS", "POST", "t", "http://srv:7070", "", "", true, false, false},
		{"header, https origin on TLS", "POST", "t", "https://srv:7070", "", "", true, false, true},
		{"https origin behind a TLS proxy", "POST", "t", "https://srv:7070", "", "", false, true, true},
		{"http origin behind a TLS proxy", "POST", "t", "http://srv:7070", "", "", false, true, false},
		{"websocket, own origin", "GET", "", "http://srv:7070", "", "websocket", false, false, true},
		{"websocket, other origin", "GET", "", "http://evil.example", "", "websocket", false, false, false},
		{"websocket, no origin", "GET", "", "", "", "websocket", false, false, false},
		{"upgrade on POST", "POST", "", "http://srv:7070", "", "websocket", false, false, false},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, "http://srv:7070/v1/sandboxes", nil)
		if c.tls {
			r.TLS = &tls.ConnectionState{}
		}
		if c.proxy {
			r.Header.Set("X-Forwarded-Proto", "https")
		}
		for k, v := range map[string]string{CSRFHeader: c.csrf, "Origin": c.origin, "Sec-Fetch-Site": c.site, "Upgrade": c.upgrade} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		if got := SameOrigin(r); got != c.want {
			t.Errorf("%s: SameOrigin = %v, want %v", c.name, got, c.want)
		}
	}
}
