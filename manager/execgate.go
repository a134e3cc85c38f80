package manager

import (
	"context"

	"airlock/store"
)

// ExecGate decides whether a command may start in a sandbox: nil lets it
// run, an error refuses it and is returned to the caller as is. via names
// the surface ("api", "e2b").
type ExecGate func(ctx context.Context, keyID, sandboxID string, argv []string, via string) error

// SetExecGate installs g, which AuditFirst asks before it records an exec:
// every surface that audits a command before starting it (the API, E2B)
// is then held to the same approval policy. Call it before serving.
func (m *Manager) SetExecGate(g ExecGate) { m.execGate = g }

// gateExec asks the exec gate about an exec about to be audited.
func (m *Manager) gateExec(ctx context.Context, keyID, sandboxID, action string, detail any) error {
	if m.execGate == nil || action != store.ActionExec {
		return nil
	}
	d, _ := detail.(map[string]any)
	argv, _ := d["argv"].([]string)
	via, _ := d["via"].(string)
	if via == "" {
		via = "api"
	}
	return m.execGate(ctx, keyID, sandboxID, argv, via)
}
