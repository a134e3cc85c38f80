package approval

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"slices"
	"sync"
	"time"
)

// DefaultTimeout is how long a pending approval waits for an answer
// before it is denied.
const DefaultTimeout = 5 * time.Minute

// Error codes the caller sees.
const (
	// CodeDenied: a deny rule matched, or a human denied the action.
	CodeDenied = "approval_denied"
	// CodeTimeout: nobody answered in time; the action was denied.
	CodeTimeout = "approval_timeout"
)

// Audit actions the Gate records.
const (
	AuditRequested = "approval.requested"
	AuditDecided   = "approval.decided"
)

// Decisions.
const (
	Approve = "approve"
	Deny    = "deny"
	Timeout = "timeout"
	// Cancelled: the caller went away before an answer.
	Cancelled = "cancelled"
)

// Error is an action refused by the approval policy. Code is CodeDenied
// or CodeTimeout.
type Error struct {
	Code       string
	ApprovalID string
	Msg        string
}

func (e *Error) Error() string { return e.Msg }

// Elicitor asks a connected human directly (MCP elicitation). It returns
// whether the human approved, with their reason, or an error if nobody
// could be asked.
type Elicitor func(ctx context.Context, message string) (approved bool, reason string, err error)

// Config configures a Gate.
type Config struct {
	// Policy is the server's policy; nil requires nothing.
	Policy *Policy
	// KeyPolicy returns an API key's own policy (nil for none). An error
	// refuses the action (fail closed).
	KeyPolicy func(ctx context.Context, keyID string) (*Policy, error)
	// Timeout bounds the wait for an answer; 0 means DefaultTimeout.
	Timeout time.Duration
	// SandboxPolicyDir, if set, keeps sandboxes' own policies on disk
	// (DIR/SANDBOX_ID.json) so that they survive a server restart.
	SandboxPolicyDir string
	// SandboxPolicies, if set, keeps sandboxes' own policies instead of
	// SandboxPolicyDir: in a database every server sharing it reads
	// (store.Store with a shared database), so a sandbox created through
	// one server is held to its rules by all.
	SandboxPolicies SandboxPolicyStore
	// PendingStore, if set, shares pending approvals with the other
	// servers using it: any of them lists and answers an approval that
	// one of them holds a request for.
	PendingStore PendingStore
	// Webhook, if set, is told about every pending approval.
	Webhook *Webhook
	// NoElicitation ignores Check's elicitor: MCP clients are not asked,
	// approvals wait for an approver key or the webhook. An elicitation is
	// answered by the MCP client of the very key whose action is held, so
	// it is only as good as that client's honesty in asking its user.
	NoElicitation bool
	// Audit records an event; an error when recording a request refuses
	// the action (nothing runs unaudited). Required.
	Audit func(ctx context.Context, keyID, sandboxID, action string, detail any) error
	// Logf logs delivery problems; log.Printf if nil.
	Logf func(format string, args ...any)
}

// SandboxPolicyStore keeps sandboxes' own policies (JSON) for servers
// sharing them. A sandbox without one reads back nil.
type SandboxPolicyStore interface {
	SetSandboxApprovalPolicy(ctx context.Context, sandboxID string, policy json.RawMessage) error
	SandboxApprovalPolicy(ctx context.Context, sandboxID string) (json.RawMessage, error)
}

// PendingStore keeps pending approvals where every server sharing it
// sees them (store.Store with a shared database). The first answer wins.
type PendingStore interface {
	// PutPendingApproval records a pending approval (JSON of Pending).
	PutPendingApproval(ctx context.Context, id string, pending json.RawMessage, expires time.Time) error
	// AnswerPendingApproval records decision (JSON of Decision) if the
	// approval exists and has none yet, reporting whether it did.
	AnswerPendingApproval(ctx context.Context, id string, decision json.RawMessage) (bool, error)
	// PendingApproval returns an approval and its decision (nil while
	// undecided); pending is nil for an unknown one.
	PendingApproval(ctx context.Context, id string) (pending, decision json.RawMessage, err error)
	// PendingApprovals returns the undecided, unexpired approvals.
	PendingApprovals(ctx context.Context) ([]json.RawMessage, error)
	// DeletePendingApproval forgets an approval once its request ended.
	DeletePendingApproval(ctx context.Context, id string) error
}

// pollInterval is how often a server holding a request shared through a
// PendingStore looks for an answer another server recorded.
const pollInterval = 200 * time.Millisecond

// Pending is an action waiting for a human.
type Pending struct {
	ID        string    `json:"id"`
	Action    Action    `json:"action"`
	Summary   string    `json:"summary"`
	Reason    string    `json:"reason"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`

	done     chan struct{}
	decision Decision
}

// Decision is the answer to a pending approval.
type Decision struct {
	// Decision is approve, deny, timeout or cancelled.
	Decision string `json:"decision"`
	// By is who answered: "key:ID", "webhook", "mcp-elicitation",
	// "policy" or "timeout".
	By     string    `json:"by"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// Gate decides whether actions may run.
type Gate struct {
	cfg Config

	mu       sync.Mutex
	pending  map[string]*Pending
	sandbox  map[string]*Policy
	closed   bool
	inflight sync.WaitGroup
}

// ErrNotFound: no pending approval has that ID (answered, expired or
// never existed).
var ErrNotFound = errors.New("no such pending approval")

// New returns a Gate.
func New(cfg Config) (*Gate, error) {
	if cfg.Audit == nil {
		return nil, errors.New("approval: Audit is required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	return &Gate{cfg: cfg, pending: map[string]*Pending{}, sandbox: map[string]*Policy{}}, nil
}

// Timeout is how long a pending approval waits.
func (g *Gate) Timeout() time.Duration { return g.cfg.Timeout }

// SetSandboxPolicy narrows a sandbox's approvals with p: its rules are
// added to the server's and the key's, so it can only require more. With
// Config.SandboxPolicyDir it is written to disk first; an error means it
// is not in force.
func (g *Gate) SetSandboxPolicy(sandboxID string, p *Policy) error {
	if g == nil || p.Empty() {
		return nil
	}
	if g.cfg.SandboxPolicies != nil {
		b, err := json.Marshal(p)
		if err != nil {
			return fmt.Errorf("approval policy of %s: %w", sandboxID, err)
		}
		if err := g.cfg.SandboxPolicies.SetSandboxApprovalPolicy(context.Background(), sandboxID, b); err != nil {
			return err
		}
	} else if g.cfg.SandboxPolicyDir != "" {
		b, err := json.Marshal(p)
		if err != nil {
			return fmt.Errorf("approval policy of %s: %w", sandboxID, err)
		}
		if err := writeFileAtomic(g.cfg.SandboxPolicyDir, sandboxID, b); err != nil {
			return err
		}
	}
	g.mu.Lock()
	g.sandbox[sandboxID] = p
	g.mu.Unlock()
	return nil
}

// sandboxPolicy returns a sandbox's own policy, from memory or, after a
// restart, from Config.SandboxPolicyDir; or from Config.SandboxPolicies,
// where "none" is not remembered: another server may be setting it.
func (g *Gate) sandboxPolicy(ctx context.Context, sandboxID string) (*Policy, error) {
	g.mu.Lock()
	p, ok := g.sandbox[sandboxID]
	g.mu.Unlock()
	if g.cfg.SandboxPolicies != nil && p == nil {
		raw, err := g.cfg.SandboxPolicies.SandboxApprovalPolicy(ctx, sandboxID)
		if err != nil || raw == nil {
			return nil, err
		}
		if p, err = Parse(raw); err != nil {
			return nil, err
		}
		g.mu.Lock()
		g.sandbox[sandboxID] = p // a sandbox's policy never changes
		g.mu.Unlock()
		return p, nil
	}
	if ok || g.cfg.SandboxPolicyDir == "" {
		return p, nil
	}
	p, err := readPolicyFile(g.cfg.SandboxPolicyDir, sandboxID)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.sandbox[sandboxID] = p // nil too: no file, no policy
	g.mu.Unlock()
	return p, nil
}

// Check lets a run, refuses it (a deny rule matched), or holds it until a
// human answers: through Answer (HTTP, webhook callback) or el, if not
// nil. It returns nil to go ahead, an *Error when refused, or the error
// recording the request in the audit log. A nil Gate lets everything run.
func (g *Gate) Check(ctx context.Context, a Action, el Elicitor) error {
	if g == nil {
		return nil
	}
	policies := []*Policy{g.cfg.Policy}
	if g.cfg.KeyPolicy != nil {
		kp, err := g.cfg.KeyPolicy(ctx, a.Owner)
		if err != nil {
			return &Error{Code: CodeDenied, Msg: fmt.Sprintf("approval policy of key %s unreadable, refusing: %v", a.Owner, err)}
		}
		policies = append(policies, kp)
	}
	if a.Sandbox != "" {
		sp, err := g.sandboxPolicy(ctx, a.Sandbox)
		if err != nil {
			return &Error{Code: CodeDenied, Msg: fmt.Sprintf("approval policy of sandbox %s unreadable, refusing: %v", a.Sandbox, err)}
		}
		policies = append(policies, sp)
	}
	if err := resolveWindow(ctx, &a, policies); err != nil {
		g.cfg.Audit(ctx, a.Owner, a.Sandbox, AuditDecided, map[string]any{"action": a,
			"decision": Decision{Decision: Deny, By: "policy", Reason: err.Error(), At: time.Now().UTC()}})
		return err
	}
	v := judge(&a, policies...)
	switch {
	case v.deny != nil:
		d := Decision{Decision: Deny, By: "policy", Reason: ruleText(v.deny), At: time.Now().UTC()}
		g.cfg.Audit(ctx, a.Owner, a.Sandbox, AuditDecided, map[string]any{"action": a, "decision": d})
		return &Error{Code: CodeDenied, Msg: fmt.Sprintf("approval_denied: %s is refused by the approval policy (%s)", a.Summary(), d.Reason)}
	case v.require == nil:
		return nil
	}
	return g.wait(ctx, a, ruleText(v.require), el)
}

func (g *Gate) wait(ctx context.Context, a Action, reason string, el Elicitor) error {
	var idb [12]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return fmt.Errorf("approval: random id: %w", err)
	}
	now := time.Now().UTC()
	p := &Pending{ID: "apr_" + hex.EncodeToString(idb[:]), Action: a, Summary: a.Summary(), Reason: reason,
		CreatedAt: now, ExpiresAt: now.Add(g.cfg.Timeout), done: make(chan struct{})}
	// Fail closed: nobody is asked about an action the log does not show.
	if err := g.cfg.Audit(ctx, a.Owner, a.Sandbox, AuditRequested, map[string]any{"approval_id": p.ID, "action": a,
		"reason": reason, "expires_at": p.ExpiresAt}); err != nil {
		return err
	}
	if ps := g.cfg.PendingStore; ps != nil {
		b, err := json.Marshal(p)
		if err == nil {
			err = ps.PutPendingApproval(ctx, p.ID, b, p.ExpiresAt)
		}
		if err != nil {
			// Fail closed: an approval the other servers cannot see
			// could not be answered through them.
			return g.finish(ctx, p, Decision{Decision: Deny, By: "server", Reason: "cannot share the pending approval: " + err.Error()})
		}
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return g.finish(ctx, p, Decision{Decision: Deny, By: "server", Reason: "server shutting down"})
	}
	g.pending[p.ID] = p
	ask := el != nil && !g.cfg.NoElicitation
	// Counted under the lock that checked closed, so Close's Wait sees
	// every helper goroutine.
	if g.cfg.Webhook != nil {
		g.inflight.Add(1)
	}
	if ask {
		g.inflight.Add(1)
	}
	g.mu.Unlock()

	if ps := g.cfg.PendingStore; ps != nil {
		defer ps.DeletePendingApproval(context.WithoutCancel(ctx), p.ID)
		go g.poll(ps, p)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	if g.cfg.Webhook != nil {
		go func() {
			defer g.inflight.Done()
			if err := g.cfg.Webhook.Deliver(wctx, p); err != nil {
				g.cfg.Logf("approval %s: webhook: %v", p.ID, err)
			}
		}()
	}
	if ask {
		go func() {
			defer g.inflight.Done()
			ok, why, err := el(wctx, fmt.Sprintf("airlock asks for approval: %s. Reason: %s. Approve?", p.Summary, reason))
			if err != nil {
				if wctx.Err() == nil {
					g.cfg.Logf("approval %s: elicitation: %v (waiting for an answer at /v1/approvals)", p.ID, err)
				}
				return
			}
			d := Decision{Decision: Deny, By: "mcp-elicitation", Reason: why}
			if ok {
				d.Decision = Approve
			}
			g.Answer(p.ID, d)
		}()
	}
	t := time.NewTimer(time.Until(p.ExpiresAt))
	defer t.Stop()
	var late Decision
	select {
	case <-p.done:
	case <-t.C:
		late = Decision{Decision: Timeout, By: "timeout", Reason: fmt.Sprintf("no answer within %s", g.cfg.Timeout)}
	case <-ctx.Done():
		late = Decision{Decision: Cancelled, By: "caller", Reason: "the caller went away"}
	}
	if late.Decision != "" {
		if err := g.Answer(p.ID, late); err != nil && g.cfg.PendingStore != nil {
			// Another server's answer may have won in the store: the
			// poller brings it, or else the late decision stands.
			select {
			case <-p.done:
			case <-time.After(3 * pollInterval):
				g.decide(p.ID, late)
			}
		}
	}
	<-p.done
	return g.finish(ctx, p, p.decision)
}

// finish audits d and turns it into the caller's result.
func (g *Gate) finish(ctx context.Context, p *Pending, d Decision) error {
	if d.At.IsZero() {
		d.At = time.Now().UTC()
	}
	g.cfg.Audit(ctx, p.Action.Owner, p.Action.Sandbox, AuditDecided, map[string]any{"approval_id": p.ID,
		"action": p.Action, "decision": d})
	why := ""
	if d.Reason != "" {
		why = ": " + d.Reason
	}
	switch d.Decision {
	case Approve:
		return nil
	case Timeout:
		return &Error{Code: CodeTimeout, ApprovalID: p.ID, Msg: fmt.Sprintf("approval_timeout: nobody approved %s within %s (approval %s); it did not run", p.Summary, g.cfg.Timeout, p.ID)}
	case Cancelled:
		return &Error{Code: CodeDenied, ApprovalID: p.ID, Msg: fmt.Sprintf("approval_denied: %s was not run: the request ended before an answer", p.Summary)}
	}
	return &Error{Code: CodeDenied, ApprovalID: p.ID, Msg: fmt.Sprintf("approval_denied: %s denied %s (approval %s)%s", d.By, p.Summary, p.ID, why)}
}

// Answer decides a pending approval; the first answer wins. d.Decision
// must be approve or deny (timeout and cancelled are the Gate's own).
// With a PendingStore the answer is recorded there, so it also decides an
// approval another server holds.
func (g *Gate) Answer(id string, d Decision) error {
	if g == nil {
		return ErrNotFound
	}
	if !slices.Contains([]string{Approve, Deny, Timeout, Cancelled}, d.Decision) {
		return fmt.Errorf("approval: decision must be %s or %s", Approve, Deny)
	}
	ps := g.cfg.PendingStore
	if ps == nil {
		return g.decide(id, d)
	}
	d.At = time.Now().UTC()
	b, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("approval %s: %w", id, err)
	}
	ok, err := ps.AnswerPendingApproval(context.Background(), id, b)
	if err != nil {
		if d.Decision != Approve {
			g.decide(id, d) // refusing needs no agreement (fail closed)
		}
		return fmt.Errorf("approval %s: %w", id, err)
	}
	if !ok {
		return ErrNotFound // unknown, or already answered
	}
	g.decide(id, d) // at once when the request is held here
	return nil
}

// poll waits for an answer to p recorded in ps by another server.
func (g *Gate) poll(ps PendingStore, p *Pending) {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
		}
		_, raw, err := ps.PendingApproval(context.Background(), p.ID)
		if err != nil || raw == nil {
			continue
		}
		var d Decision
		if err := json.Unmarshal(raw, &d); err != nil || !slices.Contains([]string{Approve, Deny, Timeout, Cancelled}, d.Decision) {
			d = Decision{Decision: Deny, By: "server", Reason: "unreadable answer in the shared store"}
		}
		g.decide(p.ID, d)
		return
	}
}

// decide ends the wait of a request held here; the first decision wins.
func (g *Gate) decide(id string, d Decision) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.pending[id]
	if p == nil {
		return ErrNotFound
	}
	delete(g.pending, id)
	if d.At.IsZero() {
		d.At = time.Now().UTC()
	}
	p.decision = d
	close(p.done)
	return nil
}

// Get returns a pending approval, held here or, with a PendingStore, by
// another server.
func (g *Gate) Get(id string) (Pending, bool) {
	if g == nil {
		return Pending{}, false
	}
	g.mu.Lock()
	p := g.pending[id]
	g.mu.Unlock()
	if p != nil {
		return *p, true
	}
	if g.cfg.PendingStore == nil {
		return Pending{}, false
	}
	raw, dec, err := g.cfg.PendingStore.PendingApproval(context.Background(), id)
	if err != nil || raw == nil || dec != nil {
		return Pending{}, false
	}
	var sp Pending
	if json.Unmarshal(raw, &sp) != nil || !time.Now().Before(sp.ExpiresAt) {
		return Pending{}, false
	}
	return sp, true
}

// List returns the pending approvals, oldest first, that keep says to.
func (g *Gate) List(keep func(*Pending) bool) []Pending {
	out := []Pending{}
	if g == nil {
		return out
	}
	g.mu.Lock()
	for _, p := range g.pending {
		if keep(p) {
			out = append(out, *p)
		}
	}
	g.mu.Unlock()
	if ps := g.cfg.PendingStore; ps != nil {
		all, err := ps.PendingApprovals(context.Background())
		if err != nil {
			g.cfg.Logf("approvals of other servers: %v", err)
		}
		for _, raw := range all {
			var sp Pending
			if json.Unmarshal(raw, &sp) != nil || slices.ContainsFunc(out, func(o Pending) bool { return o.ID == sp.ID }) {
				continue
			}
			g.mu.Lock()
			_, here := g.pending[sp.ID]
			g.mu.Unlock()
			if !here && keep(&sp) {
				out = append(out, sp)
			}
		}
	}
	slices.SortFunc(out, func(a, b Pending) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out
}

// Close denies every pending approval and refuses new ones.
func (g *Gate) Close() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.closed = true
	ids := make([]string, 0, len(g.pending))
	for id := range g.pending {
		ids = append(ids, id)
	}
	g.mu.Unlock()
	for _, id := range ids {
		g.Answer(id, Decision{Decision: Deny, By: "server", Reason: "server shutting down"})
	}
	g.inflight.Wait()
}
