package server

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/policy"
)

// approvalRoutes registers the approval endpoints. Answers come from an
// approver key (Config.Approvers), or unauthenticated but signed with the
// webhook secret (the webhook receiver's callback); a key never answers an
// approval of its own actions, so an agent cannot approve itself.
func (s *Server) approvalRoutes(authed func(pattern string, h handler)) {
	authed("GET /v1/approvals", s.listApprovals)
	authed("GET /v1/approvals/{id}", s.getApproval)
	s.mux.Handle("POST /v1/approvals/{id}", s.wrap(s.answerApproval, false))
}

// approve holds a request's action for approval (a no-op without policy);
// it fills in the caller and the surface.
func (s *Server) approve(r *http.Request, a approval.Action) error {
	if s.gate == nil {
		return nil
	}
	a.Owner, a.Via = caller(r).id, "api"
	return s.gate.Check(r.Context(), a, nil)
}

// isApprover reports whether key may see and answer every approval.
func (s *Server) isApprover(key string) bool {
	return s.cfg.NoAuth || slices.Contains(s.cfg.Approvers, key)
}

func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r); err != nil {
		return err
	}
	k := caller(r).id
	all := s.isApprover(k)
	list := s.gate.List(func(p *approval.Pending) bool { return all || p.Action.Owner == k })
	writeJSON(w, 200, map[string]any{"approvals": list})
	return nil
}

func (s *Server) getApproval(w http.ResponseWriter, r *http.Request) error {
	k := caller(r).id
	p, ok := s.gate.Get(r.PathValue("id"))
	if !ok || (!s.isApprover(k) && p.Action.Owner != k) {
		return errf(404, "not_found", "no pending approval %s (answered, expired or never asked)", r.PathValue("id"))
	}
	writeJSON(w, 200, p)
	return nil
}

// AnswerRequest is the body of POST /v1/approvals/{id}.
type AnswerRequest struct {
	// Decision is approve or deny.
	Decision string `json:"decision"`
	// Reason is recorded in the audit log and shown to the caller.
	Reason string `json:"reason,omitempty"`
	// ID repeats the approval's id; required in signed answers, so that a
	// signed answer cannot be replayed for another approval.
	ID string `json:"id,omitempty"`
}

func (s *Server) answerApproval(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	var by string
	if sig := r.Header.Get(approval.SignatureHeader); sig != "" {
		if len(s.cfg.WebhookSecret) == 0 {
			return errf(401, "unauthorized", "signed answers need a webhook secret (airlock serve --approval-webhook-secret-file)")
		}
		if err := approval.Verify(s.cfg.WebhookSecret, r.Header.Get(approval.TimestampHeader), sig, body, time.Now()); err != nil {
			return errf(401, "unauthorized", "approval answer refused: %v", err)
		}
		by = "webhook"
	} else {
		k, err := s.authenticate(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock"`)
			return errf(401, "unauthorized", "%v (or sign the answer with the webhook secret)", err)
		}
		if !s.isApprover(k.id) {
			return errf(403, "forbidden", "key %s is not an approver (airlock serve --approver-key); an agent's key cannot answer approvals", k.id)
		}
		by = "key:" + k.id
		if s.cfg.NoAuth {
			by = "local"
		}
	}
	var req AnswerRequest
	if err := DecodeJSON(bytes.NewReader(body), &req); err != nil {
		return err
	}
	if req.Decision != approval.Approve && req.Decision != approval.Deny {
		return errf(400, "bad_request", "decision must be approve or deny")
	}
	if by == "webhook" && req.ID != id {
		return errf(401, "unauthorized", "approval answer refused: a signed answer must name its approval (\"id\": %q)", id)
	}
	if req.ID != "" && req.ID != id {
		return errf(400, "bad_request", "id %q does not match the path's %q", req.ID, id)
	}
	p, ok := s.gate.Get(id)
	if ok && !s.cfg.NoAuth && by == "key:"+p.Action.Owner {
		return errf(403, "forbidden", "a key cannot answer an approval of its own action")
	}
	err = s.gate.Answer(id, approval.Decision{Decision: req.Decision, By: by, Reason: req.Reason})
	if errors.Is(err, approval.ErrNotFound) {
		return errf(404, "not_found", "no pending approval %s (answered, expired or never asked)", id)
	}
	if err != nil {
		return err
	}
	writeJSON(w, 200, map[string]any{"id": id, "decision": req.Decision, "by": by})
	return nil
}

// approveCreate holds a sandbox creation for approval: its limits (the
// profile's where the request gives none) and, when it asks for network,
// the widening from none. It also checks the request's own approval
// policy, which only adds rules.
func (s *Server) approveCreate(r *http.Request, req *CreateRequest) error {
	if req.Approval != nil {
		if err := req.Approval.Compile(); err != nil {
			return errf(400, "bad_request", "%v", err)
		}
		if s.gate == nil {
			return errf(400, "bad_request", "this server has no approval gate; a sandbox's approval policy needs airlock serve --approval-policy or --approval-webhook")
		}
	}
	if s.gate == nil {
		return nil
	}
	lim := &approval.Limits{TimeoutSeconds: req.Timeout}
	if pre, err := policy.Preset(policy.Profile(req.Profile)); err == nil {
		lim.MemoryBytes, lim.CPUs, lim.Pids, lim.DiskBytes = pre.Limits.MemoryBytes, pre.Limits.CPUs, pre.Limits.Pids, pre.Limits.DiskBytes
	}
	if l := req.Limits; l != nil {
		lim.MemoryBytes = cmp.Or(l.MemoryBytes, lim.MemoryBytes)
		lim.CPUs = cmp.Or(l.CPUs, lim.CPUs)
		lim.Pids = cmp.Or(l.Pids, lim.Pids)
		lim.DiskBytes = cmp.Or(l.DiskBytes, lim.DiskBytes)
	}
	if err := s.approve(r, approval.Action{Kind: approval.KindCreate, Limits: lim}); err != nil {
		return err
	}
	if req.Network != nil {
		to := req.Network.policy()
		if err := s.approve(r, approval.Action{Kind: approval.KindNetwork, From: &policy.Network{Mode: policy.NetNone}, To: &to}); err != nil {
			return err
		}
	}
	return nil
}
