package manager

import (
	"context"

	"github.com/airlock-dev/airlock/store"
)

// ActionCodeCell is the audit action of a code cell (API /code, E2B
// /execute).
const ActionCodeCell = "code"

// ActionCodeContext is the audit action of a code context about to start
// (API and E2B /contexts): its kernel runs with the environment and
// working directory the caller gives, so it is gated as a cell of its
// language.
const ActionCodeContext = "code.context"

// ExecGate decides whether code may start running in a sandbox: a
// command (action store.ActionExec, detail "argv"), a code cell (action
// ActionCodeCell) or a code context (ActionCodeContext), whose detail
// "language" is the language that will run (a cell's context's). detail is what is about to be
// audited; its "via" names the surface ("e2b"; absent for the API). nil
// lets it run; an error refuses it and is returned to the caller as is.
type ExecGate func(ctx context.Context, keyID, sandboxID, action string, detail map[string]any) error

// SetExecGate installs g, which AuditFirst asks before it records a
// command or a code cell: every surface that audits them before starting
// them (the API, E2B) is held to the same approval policy. Call it before
// serving.
func (m *Manager) SetExecGate(g ExecGate) { m.execGate = g }

// gateExec asks the exec gate about an action about to be audited.
func (m *Manager) gateExec(ctx context.Context, keyID, sandboxID, action string, detail any) error {
	if m.execGate == nil || (action != store.ActionExec && action != ActionCodeCell && action != ActionCodeContext) {
		return nil
	}
	d, _ := detail.(map[string]any)
	return m.execGate(ctx, keyID, sandboxID, action, d)
}
