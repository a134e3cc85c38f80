package e2b

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"

	"airlock/agent"
	"airlock/manager"
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
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(port)})
			pr.Out.Host = pr.In.Host
			// What the proxy consumed stays here.
			for _, k := range []string{headerSandboxID, headerSandboxPort, headerAccessToken, headerTrafficToken, headerAPIKey} {
				pr.Out.Header.Del(k)
			}
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return sb.Agent().Dial(ctx, port)
			},
			DisableKeepAlives: true,
			Proxy:             nil,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var ae *agent.Error
			msg := fmt.Sprintf("port %d of sandbox %s: %v", port, sb.ID, err)
			if errors.As(err, &ae) && ae.Code == agent.CodeNotFound {
				msg = fmt.Sprintf("nothing listens on port %d of sandbox %s", port, sb.ID)
			}
			// As E2B's proxy: a 502 when the port does not answer.
			writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": msg,
				"sandboxId": sb.ID, "port": port})
		},
	}
	rp.ServeHTTP(w, r)
}
