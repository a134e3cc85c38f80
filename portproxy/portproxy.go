// Package portproxy relays HTTP requests, upgraded connections (WebSockets)
// included, to a TCP port on a sandbox's loopback interface through the
// sandbox's agent (agent.Client.Dial): a server the sandbox runs is
// reachable although the sandbox has no inbound network. The E2B surface
// (getHost) and airlock's API (/v1/sandboxes/{id}/ports/{port}/...) use it.
//
// What a sandbox serves is hostile. No credential of airlock's crosses the
// relay towards the sandbox (CredentialHeaders), and a relay answering on
// an origin it shares with the API (Request.Isolate) makes every response
// a sandboxed document (an opaque origin, which can neither read the API's
// answers nor send it the dashboard's cookie) and passes no cookie either
// way.
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
	"strings"

	"github.com/airlock-dev/airlock/agent"
)

// CredentialHeaders are request headers that carry airlock's credentials
// (API keys, the dashboard's CSRF token): never relayed to a sandbox.
var CredentialHeaders = []string{"Authorization", "Proxy-Authorization", "X-API-Key", "X-Airlock-CSRF"}

// SandboxCSP is the Content-Security-Policy added to every response of an
// isolated relay: the page is a sandboxed document (scripts, forms and
// popups work, but in an opaque origin, without allow-same-origin), so it
// is another origin than the API's although its URL is on the API's.
const SandboxCSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"

// isolatedResponseDrop are response headers an isolated relay removes: a
// sandbox must not set or clear the API origin's cookies or storage, nor
// widen a service worker's scope over it.
var isolatedResponseDrop = []string{"Set-Cookie", "Set-Cookie2", "Clear-Site-Data", "Service-Worker-Allowed"}

// Request is one request to relay.
type Request struct {
	// Agent is the sandbox's agent.
	Agent *agent.Client
	// Dial, if set, reaches the port instead of Agent (a relay to
	// something other than a sandbox).
	Dial func(ctx context.Context) (net.Conn, error)
	// Port is the port on the sandbox's loopback.
	Port int
	// Path replaces the request's path when not empty (a prefix the API
	// routed by is not the sandbox server's).
	Path string
	// Drop names request headers the sandbox must not see (credentials of
	// the proxy itself), besides CredentialHeaders.
	Drop []string
	// Isolate is for a relay on the API's own origin: no cookie crosses
	// it either way (the browser's cookies there are the API's), and
	// every response is a sandboxed document (SandboxCSP). Without it, a
	// response may set only host-only cookies (no Domain attribute, which
	// would reach the API's host and every other sandbox's).
	Isolate bool
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
			for _, k := range CredentialHeaders {
				pr.Out.Header.Del(k)
			}
			for _, k := range req.Drop {
				pr.Out.Header.Del(k)
			}
			if req.Isolate {
				pr.Out.Header.Del("Cookie")
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			FilterResponse(resp.Header, req.Isolate)
			return nil
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				if req.Dial != nil {
					return req.Dial(ctx)
				}
				return req.Agent.Dial(ctx, req.Port)
			},
			DisableKeepAlives: true,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) { req.Fail(w, err) },
	}
	rp.ServeHTTP(w, r)
}

// FilterResponse makes the headers of a sandbox's response safe to pass
// on: isolated, without cookies and as a sandboxed document; otherwise
// without any cookie scoped beyond the response's own host.
func FilterResponse(h http.Header, isolate bool) {
	if isolate {
		for _, k := range isolatedResponseDrop {
			h.Del(k)
		}
		// Added, not set: a policy of the sandbox's own still applies,
		// and cannot lift this one (every policy is enforced).
		h.Add("Content-Security-Policy", SandboxCSP)
		return
	}
	var keep []string
	for _, v := range h.Values("Set-Cookie") {
		if !domainCookie(v) {
			keep = append(keep, v)
		}
	}
	h.Del("Set-Cookie")
	h.Del("Set-Cookie2")
	for _, v := range keep {
		h.Add("Set-Cookie", v)
	}
}

// domainCookie reports whether a Set-Cookie value has a Domain attribute
// (or cannot be parsed, which counts as one: fail closed).
func domainCookie(v string) bool {
	if _, err := http.ParseSetCookie(v); err != nil {
		return true
	}
	for _, attr := range strings.Split(v, ";")[1:] {
		name, _, _ := strings.Cut(strings.TrimSpace(attr), "=")
		if strings.EqualFold(strings.TrimSpace(name), "domain") {
			return true
		}
	}
	return false
}

// Describe explains a failure to reach port.
func Describe(port int, err error) string {
	var ae *agent.Error
	if errors.As(err, &ae) && ae.Code == agent.CodeNotFound {
		return fmt.Sprintf("nothing listens on port %d in the sandbox", port)
	}
	return fmt.Sprintf("port %d of the sandbox: %v", port, err)
}
