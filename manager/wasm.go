package manager

import (
	"encoding/json"
	"fmt"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// ExecArgv returns what an exec of argv runs in this sandbox: argv as it
// is, unless the sandbox's tier rewrites execs (tier.ExecRewriter: a wasm
// sandbox runs MODULE.wasm ARGS with its agent's wasm-exec, and refuses a
// shell command).
func (s *Sandbox) ExecArgv(argv []string, shell bool) ([]string, error) {
	s.mu.Lock()
	raw, known, rewrites := s.rec.Policy, s.rewritesKnown, s.rewrites
	s.mu.Unlock()
	if known && !rewrites {
		// Most tiers: nothing to decode on every exec.
		return argv, nil
	}
	var p policy.Policy
	if len(raw) == 0 || json.Unmarshal(raw, &p) != nil {
		return argv, nil
	}
	t, err := tier.Lookup(p.Runtime)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	rw, ok := t.(tier.ExecRewriter)
	s.mu.Lock()
	s.rewrites, s.rewritesKnown = ok, true
	s.mu.Unlock()
	if !ok {
		return argv, nil
	}
	out, err := rw.ExecArgv(&p, argv, shell)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return out, nil
}
