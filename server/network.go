package server

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
)

// Network log paging.
const (
	// DefaultNetworkLog is how many network log entries a request returns
	// without a limit.
	DefaultNetworkLog = 1000
	// MaxNetworkLog is the largest limit a client may ask for.
	MaxNetworkLog = 10000
)

// NetworkRequest is the body of PUT /v1/sandboxes/{id}/network.
type NetworkRequest struct {
	// Mode is none (or empty), allowlist or open.
	Mode string `json:"mode"`
	// Allow and Deny are lists of names, *.wildcards, IPs and CIDR blocks,
	// each with an optional :port (docs/network.md).
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

func (req *NetworkRequest) policy() policy.Network {
	return policy.Network{Mode: policy.NetworkMode(req.Mode), Allow: req.Allow, Deny: req.Deny}
}

// networkRoutes registers the network endpoints.
func (s *Server) networkRoutes(authed func(pattern string, h handler)) {
	authed("GET /v1/sandboxes/{id}/network", s.getNetwork)
	authed("PUT /v1/sandboxes/{id}/network", s.setNetwork)
	authed("GET /v1/sandboxes/{id}/network/log", s.networkLog)
}

func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) error {
	info, err := s.m.Network(r.Context(), caller(r).id, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, info)
	return nil
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) error {
	var req NetworkRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if s.gate != nil {
		cur, err := s.m.Network(r.Context(), caller(r).id, r.PathValue("id"))
		if err != nil {
			return err
		}
		from := policy.Network{Mode: policy.NetworkMode(cur.Mode), Allow: cur.Allow, Deny: cur.Deny}
		to := req.policy()
		if err := s.approve(r, approval.Action{Kind: approval.KindNetwork, Sandbox: r.PathValue("id"), From: &from, To: &to}); err != nil {
			return err
		}
	}
	info, err := s.m.SetNetwork(r.Context(), caller(r).id, r.PathValue("id"), req.policy())
	if errors.Is(err, manager.ErrNetwork) {
		return errf(409, "conflict", "%v", err)
	}
	if err != nil {
		return err
	}
	writeJSON(w, 200, info)
	return nil
}

func (s *Server) networkLog(w http.ResponseWriter, r *http.Request) error {
	limit := DefaultNetworkLog
	for k, vs := range r.URL.Query() {
		if k != "limit" || len(vs) != 1 {
			return errf(400, "bad_request", "unknown or repeated query parameter %q", k)
		}
		n, err := strconv.Atoi(vs[0])
		if err != nil || n < 1 || n > MaxNetworkLog {
			return errf(400, "bad_request", "limit must be an integer in [1, %d]", MaxNetworkLog)
		}
		limit = n
	}
	log, err := s.m.NetworkLog(r.Context(), caller(r).id, r.PathValue("id"), limit)
	if err != nil {
		return err
	}
	writeJSON(w, 200, map[string]any{"connections": log})
	return nil
}
