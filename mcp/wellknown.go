package mcp

import (
	"encoding/json"
	"net/http"
	"strings"
)

// bearerHint is what a client looking for OAuth is told.
const bearerHint = "airlock does not use OAuth: send an airlock API key (airlock keys create) as the header 'Authorization: Bearer al_...'"

// OAuthDiscovery answers the discovery requests of MCP clients that look
// for OAuth before they send a bearer token, so that they learn a key is
// the way in instead of starting an authorization flow:
//
//   - /.well-known/oauth-protected-resource (and .../mcp): RFC 9728
//     metadata naming the MCP endpoint, bearer tokens in the header, and
//     no authorization server;
//   - /.well-known/oauth-authorization-server and
//     /.well-known/openid-configuration (and their path forms): 404 with a
//     JSON body saying so.
func OAuthDiscovery() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Access-Control-Allow-Origin", "*")
		if strings.HasPrefix(r.URL.Path, "/.well-known/oauth-protected-resource") {
			scheme := "http"
			if r.TLS != nil {
				scheme = "https"
			}
			json.NewEncoder(w).Encode(map[string]any{
				"resource":                 scheme + "://" + r.Host + "/mcp",
				"authorization_servers":    []string{},
				"bearer_methods_supported": []string{"header"},
				"resource_name":            "airlock MCP server",
				"airlock_authentication":   bearerHint,
			})
			return
		}
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(map[string]string{"error": "not_found", "message": bearerHint})
	})
}
