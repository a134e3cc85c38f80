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
		tls                  bool
		want                 bool
	}{
		{"header, no origin", "GET", "t", "", "", "", false, true},
		{"header, own origin", "POST", "t", "http://srv:7070", "same-origin", "", false, true},
		{"no header", "POST", "", "http://srv:7070", "", "", false, false},
		{"header, other origin", "POST", "t", "http://evil.example", "", "", false, false},
		{"header, other port", "POST", "t", "http://srv:7071", "", "", false, false},
		{"header, cross-site fetch", "GET", "t", "", "cross-site", "", false, false},
		{"header, same-site fetch", "GET", "t", "", "same-site", "", false, false},
		{"header, http origin on TLS", "POST", "t", "http://srv:7070", "", "", true, false},
		{"header, https origin on TLS", "POST", "t", "https://srv:7070", "", "", true, true},
		{"websocket, own origin", "GET", "", "http://srv:7070", "", "websocket", false, true},
		{"websocket, other origin", "GET", "", "http://evil.example", "", "websocket", false, false},
		{"websocket, no origin", "GET", "", "", "", "websocket", false, false},
		{"upgrade on POST", "POST", "", "http://srv:7070", "", "websocket", false, false},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, "http://srv:7070/v1/sandboxes", nil)
		if c.tls {
			r.TLS = &tls.ConnectionState{}
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
