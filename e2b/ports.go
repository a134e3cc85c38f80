package e2b

import (
	"net/http"

	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/portproxy"
)

// Ports of a sandbox other than envd's and the code interpreter's, for
// getHost(port): HTTP and WebSocket requests with E2b-Sandbox-Id and
// E2b-Sandbox-Port are relayed to that port of the sandbox's loopback
// interface, through the agent (agent.Client.Dial), so that a server the
// sandbox runs is reachable although the sandbox has no inbound network.
// Unlike E2B, where ports are public unless allowPublicTraffic is false,
// every request must carry the sandbox's traffic access token
// (E2b-Traffic-Access-Token) or its envd access token.

// servePort relays a request to port of sb.
func (h *Handler) servePort(w http.ResponseWriter, r *http.Request, sb *manager.Sandbox, port int) {
	portproxy.Serve(w, r, portproxy.Request{Agent: sb.Agent(), Port: port,
		// What the proxy consumed stays here.
		Drop: []string{headerSandboxID, headerSandboxPort, headerAccessToken, headerTrafficToken, headerAPIKey},
		Fail: func(w http.ResponseWriter, err error) {
			// As E2B's proxy: a 502 when the port does not answer.
			writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway,
				"message": portproxy.Describe(port, err) + " (sandbox " + sb.ID + ")", "sandboxId": sb.ID, "port": port})
		}})
}

// HostRouted reports whether r is addressed to a sandbox's port by its host
// (PORT-SANDBOXID.Domain): a page the sandbox serves, on an origin of its
// own, never the API's.
func (h *Handler) HostRouted(r *http.Request) bool {
	_, _, ok := h.hostRoute(r.Host)
	return ok
}
