package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/store"
)

// approvalFlags are serve's human-in-the-loop flags (docs/approvals.md).
type approvalFlags struct {
	policyFile, webhookURL, secretFile string
	timeout                            time.Duration
	approvers                          stringList
	noElicit                           bool

	policy  *approval.Policy
	webhook *approval.Webhook
	secret  []byte
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func (f *approvalFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.policyFile, "approval-policy", "", "JSON or YAML file of actions that need a human's approval or are refused (docs/approvals.md); without it nothing is held")
	fs.DurationVar(&f.timeout, "approval-timeout", approval.DefaultTimeout, "how long a held action waits for an answer before it is denied (approval_timeout)")
	fs.StringVar(&f.webhookURL, "approval-webhook", "", "URL that receives each pending approval as a signed JSON POST (retried with backoff); needs --approval-webhook-secret-file")
	fs.StringVar(&f.secretFile, "approval-webhook-secret-file", "", "file holding the webhook's HMAC-SHA256 secret (at least 16 bytes); answers signed with it are accepted at POST /v1/approvals/{id}")
	fs.BoolVar(&f.noElicit, "approval-no-elicitation", false, "do not ask MCP clients through elicitation: held tool calls wait for an approver key or the webhook (an elicitation is answered by the client of the key whose call is held)")
	fs.Var(&f.approvers, "approver-key", "API key ID that may list and answer every approval (repeatable); a key never answers its own")
}

// load reads the policy and the webhook secret.
func (f *approvalFlags) load() error {
	if f.timeout <= 0 {
		return fmt.Errorf("--approval-timeout must be positive")
	}
	if f.policyFile != "" {
		p, err := approval.Load(f.policyFile)
		if err != nil {
			return fmt.Errorf("--approval-policy: %w", err)
		}
		f.policy = p
	}
	if f.secretFile != "" {
		b, err := os.ReadFile(f.secretFile)
		if err != nil {
			return fmt.Errorf("--approval-webhook-secret-file: %w", err)
		}
		f.secret = bytes.TrimSpace(b)
		if len(f.secret) < approval.MinSecret {
			return fmt.Errorf("--approval-webhook-secret-file: the secret must be at least %d bytes", approval.MinSecret)
		}
	}
	if f.webhookURL != "" {
		if f.secret == nil {
			return fmt.Errorf("--approval-webhook needs --approval-webhook-secret-file")
		}
		w, err := approval.NewWebhook(f.webhookURL, f.secret)
		if err != nil {
			return err
		}
		f.webhook = w
	}
	return nil
}

// gate makes the server's approval gate: always, since API keys may carry
// policies of their own; with no policy anywhere it lets everything run.
// Every exec the manager audits first (API, E2B) is put to it.
// Keys' and sandboxes' own policies are kept where every server sharing
// st's database finds them, or in the state directory.
func (f *approvalFlags) gate(m *manager.Manager, st *store.Store, stateDir string, logf func(string, ...any)) (*approval.Gate, error) {
	cfg := approval.Config{SandboxPolicyDir: filepath.Join(stateDir, approval.SandboxPolicyDir)}
	if st.SharedDatabase() != "" {
		cfg = approval.Config{SandboxPolicies: st, PendingStore: st}
	}
	g, err := approval.New(approval.Config{Policy: f.policy, KeyPolicy: keyPolicies(st, stateDir), Timeout: f.timeout,
		Webhook: f.webhook, Logf: logf, NoElicitation: f.noElicit,
		SandboxPolicyDir: cfg.SandboxPolicyDir, SandboxPolicies: cfg.SandboxPolicies, PendingStore: cfg.PendingStore,
		Audit: func(ctx context.Context, keyID, sandboxID, action string, detail any) error {
			return m.AuditFirst(ctx, keyID, sandboxID, action, detail)
		}})
	if err != nil {
		return nil, err
	}
	m.SetExecGate(func(ctx context.Context, keyID, sandboxID, action string, detail map[string]any) error {
		if via, _ := detail["via"].(string); via == "mcp" {
			// Held already by the MCP middleware, which can ask the
			// client's user (mcp.approvalMiddleware).
			return nil
		}
		return g.Check(ctx, approval.FromAudit(keyID, sandboxID, action, detail), nil)
	})
	return g, nil
}
