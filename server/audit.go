package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/airlock-dev/airlock/store"
)

// AuditEvent is one entry of GET /v1/audit.
type AuditEvent struct {
	ID        int64           `json:"id"`
	Time      time.Time       `json:"time"`
	KeyID     string          `json:"key_id,omitempty"`
	SandboxID string          `json:"sandbox_id,omitempty"`
	Action    string          `json:"action"`
	Detail    json.RawMessage `json:"detail,omitempty"`
}

// ParseAuditQuery turns the query parameters of GET /v1/audit (and the
// flags of `airlock audit`) into a filter: sandbox, key, action, since and
// until (RFC 3339), before (an event id: the previous page's next) and
// limit (1 to 1000, default 100).
func ParseAuditQuery(q map[string][]string) (store.AuditFilter, error) {
	f := store.AuditFilter{Limit: 100}
	for k, vs := range q {
		if len(vs) != 1 {
			return f, errf(400, "bad_request", "repeated query parameter %q", k)
		}
		v := vs[0]
		var err error
		switch k {
		case "sandbox":
			f.SandboxID = v
		case "key":
			f.KeyID = v
		case "action":
			f.Action = v
		case "since", "until":
			t, perr := time.Parse(time.RFC3339Nano, v)
			if perr != nil {
				return f, errf(400, "bad_request", "%s must be an RFC 3339 time such as 2026-01-02T15:04:05Z, not %q", k, v)
			}
			if k == "since" {
				f.Since = t
			} else {
				f.Until = t
			}
		case "before":
			if f.Before, err = strconv.ParseInt(v, 10, 64); err != nil || f.Before < 1 {
				return f, errf(400, "bad_request", "before must be a positive event id (the previous page's next)")
			}
		case "limit":
			if f.Limit, err = strconv.Atoi(v); err != nil || f.Limit < 1 || f.Limit > 1000 {
				return f, errf(400, "bad_request", "limit must be an integer in [1, 1000]")
			}
		default:
			return f, errf(400, "bad_request", "unknown query parameter %q: give sandbox, key, action, since, until, before or limit", k)
		}
	}
	return f, nil
}

// AuditPage is the body of GET /v1/audit; Next, when set, is the before of
// the next (older) page.
type AuditPage struct {
	Events []AuditEvent `json:"events"`
	Next   int64        `json:"next,omitempty"`
}

// NewAuditPage converts store events (newest first) into a page.
func NewAuditPage(evs []store.AuditEvent, limit int) AuditPage {
	page := AuditPage{Events: make([]AuditEvent, 0, len(evs))}
	for _, e := range evs {
		page.Events = append(page.Events, AuditEvent{ID: e.ID, Time: e.Time, KeyID: e.KeyID, SandboxID: e.SandboxID,
			Action: e.Action, Detail: e.Detail})
	}
	if len(evs) == limit && limit > 0 {
		page.Next = evs[len(evs)-1].ID
	}
	return page
}

// audit serves GET /v1/audit: the caller's part of the audit log (the
// events its key made and those about its sandboxes), newest first.
func (s *Server) audit(w http.ResponseWriter, r *http.Request) error {
	f, err := ParseAuditQuery(r.URL.Query())
	if err != nil {
		return err
	}
	if s.cfg.Store == nil {
		return errf(503, "unavailable", "this server has no audit log")
	}
	f.Scoped, f.Owner = true, caller(r).id
	evs, err := s.cfg.Store.AuditLog(r.Context(), f)
	if err != nil {
		return err
	}
	writeJSON(w, 200, NewAuditPage(evs, f.Limit))
	return nil
}
