package store

import (
	"context"
	"encoding/json"
	"fmt"
)

// SetSandboxPolicy replaces the stored policy of a running sandbox (a
// network policy changed while it runs). It returns an error wrapping
// ErrNotFound or ErrEnded like EndSandbox; an ended sandbox keeps the policy
// it ended with.
func (s *Store) SetSandboxPolicy(ctx context.Context, id string, pol json.RawMessage) error {
	v, err := rawJSON("policy", pol)
	if err != nil {
		return fmt.Errorf("store: set policy of %q: %w", id, err)
	}
	return s.updateRunning(ctx, "set policy of", id,
		`UPDATE sandboxes SET policy = ? WHERE id = ? AND state = 'running'`, v, id)
}
