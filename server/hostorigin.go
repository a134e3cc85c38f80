package server

import (
	"net/http"
)

// sandboxOwnOrigin reports whether r is addressed to a sandbox's port by
// host (PORT-SANDBOXID.DOMAIN, --e2b-domain) from a page of that very
// origin: the module scripts, fonts and WebSockets of a page the sandbox
// serves there (noVNC's stream page), which browsers send with an Origin
// header. Such a request is the sandbox's own page talking to itself, not
// a web page calling the API: the API guard's refusal of Origin does not
// apply to it (a cross-origin page, another sandbox's included, is still
// refused, and the port still needs the sandbox's token).
func (s *Server) sandboxOwnOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || !s.e2b.HostRouted(r) {
		return false
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	return o == "https://"+r.Host || o == "http://"+r.Host
}
