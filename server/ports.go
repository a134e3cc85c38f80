package server

import (
	"net/http"
	"strconv"

	"github.com/airlock-dev/airlock/portproxy"
)

// portsPattern is the route of the ports relay on the API's origin.
const portsPattern = "/v1/sandboxes/{id}/ports/{port}/{path...}"

// port serves /v1/sandboxes/{id}/ports/{port}/{path...}, any method: the
// request, as /{path...} with its query, goes to that port of the sandbox's
// loopback interface through its agent (package portproxy), upgrades
// (WebSockets) included. The API key authorizes it and is not passed on;
// nor are the dashboard's cookie and CSRF token. What the sandbox answers
// is served as a sandboxed document (Content-Security-Policy: sandbox,
// an opaque origin) without cookies: a page of the sandbox cannot act on
// the API with the browser's credentials (docs/SECURITY.md).
func (s *Server) port(w http.ResponseWriter, r *http.Request) error {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return errf(http.StatusBadRequest, "bad_request", "bad port %q: give a number from 1 to 65535", r.PathValue("port"))
	}
	sb, err := s.m.Lookup(caller(r).id, r.PathValue("id"))
	if err != nil {
		return err
	}
	portproxy.Serve(w, r, portproxy.Request{Agent: sb.Agent(), Port: port, Path: "/" + r.PathValue("path"),
		// The API's origin: the sandbox's pages are sandboxed documents
		// there, and no cookie crosses (portproxy.Request.Isolate).
		Isolate: true,
		Fail: func(w http.ResponseWriter, err error) {
			writeError(w, http.StatusBadGateway, "port_unreachable", portproxy.Describe(port, err))
		}})
	return nil
}
