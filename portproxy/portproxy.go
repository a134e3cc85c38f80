// Package portproxy relays HTTP requests, upgraded connections (WebSockets)
// included, to a TCP port on a sandbox's loopback interface through the
// sandbox's agent (agent.Client.Dial): a server the sandbox runs is
// reachable although the sandbox has no inbound network. The E2B surface
// (getHost) and airlock's API (/v1/sandboxes/{id}/ports/{port}/...) use it.
package portproxy

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
)

// Request is one request to relay.
type Request struct {
	// Agent is the sandbox's agent.
	Agent *agent.Client
	// Port is the port on the sandbox's loopback.
	Port int
	// Path replaces the request's path when not empty (a prefix the API
	// routed by is not the sandbox server's).
	Path string
	// Drop names request headers the sandbox must not see (credentials of
	// the proxy itself).
	Drop []string
	// Fail answers when the port cannot be reached; err is an *agent.Error
	// of code CodeNotFound when nothing listens.
	Fail func(w http.ResponseWriter, err error)
}

// Serve relays r as req says.
func Serve(w http.ResponseWriter, r *http.Request, req Request) {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(req.Port)})
			if req.Path != "" {
				pr.Out.URL.Path, pr.Out.URL.RawPath = req.Path, ""
			}
			pr.Out.Host = pr.In.Host
			for _, k := range req.Drop {
				pr.Out.Header.Del(k)
			}
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return req.Agent.Dial(ctx, req.Port)
			},
			DisableKeepAlives: true,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) { req.Fail(w, err) },
	}
	rp.ServeHTTP(w, r)
}

// Describe explains a failure to reach port.
func Describe(port int, err error) string {
	var ae *agent.Error
	if errors.As(err, &ae) && ae.Code == agent.CodeNotFound {
		return fmt.Sprintf("nothing listens on port %d in the sandbox", port)
	}
	return fmt.Sprintf("port %d of the sandbox: %v", port, err)
}
