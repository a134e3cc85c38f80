package manager

import (
	"encoding/json"
	"fmt"
	"strconv"

	"airlock/policy"
	"airlock/runtime/native"
)

// ExecArgv returns what an exec of argv runs in this sandbox. A sandbox
// with runtime wasm is a native sandbox whose execs run WASI modules:
// argv (MODULE.wasm ARGS, MODULE a file in the sandbox) is run by the
// in-sandbox airlock's wasm-exec, with the sandbox's memory limit as the
// module's linear memory cap, and a shell command is refused. Other
// sandboxes run argv as it is.
func (s *Sandbox) ExecArgv(argv []string, shell bool) ([]string, error) {
	s.mu.Lock()
	raw := s.rec.Policy
	s.mu.Unlock()
	var p policy.Policy
	if len(raw) == 0 || json.Unmarshal(raw, &p) != nil || p.Runtime != policy.RuntimeWasm {
		return argv, nil
	}
	if shell || len(argv) == 0 {
		return nil, fmt.Errorf("%w: a wasm sandbox runs WASI modules: give argv [\"MODULE.wasm\", ARGS...], not a shell command", ErrInvalid)
	}
	out := []string{native.AgentPath, "wasm-exec", "--memory", strconv.FormatInt(p.Limits.MemoryBytes, 10), "--"}
	return append(out, argv...), nil
}
