package manager

import (
	"context"
	"errors"
	"time"

	"github.com/airlock-dev/airlock/egress"
)

// Observation is one timed operation, for the Prometheus histograms of
// airlock serve (docs/operations.md).
type Observation struct {
	// Op is "create", "pause", "resume" or "egress".
	Op string
	// Runtime is the sandbox's runtime (native, gvisor, microvm, wasm),
	// or "unknown" when the operation failed before it was known.
	Runtime string
	// Status is "ok" or the class of the failure (StatusOf); for egress,
	// "allowed" or "denied".
	Status string
	// Duration is how long the operation (for egress: the connection)
	// took.
	Duration time.Duration
}

// StatusOf names the class of an operation's error for metrics, in the
// words of the API's error codes: "ok", "not_found", "not_running",
// "limit_reached", "invalid_policy", "bad_request", "canceled" or
// "internal". It never includes the error's text, which may carry
// client-supplied values.
func StatusOf(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrNotRunning), errors.Is(err, ErrPaused):
		return "not_running"
	case errors.Is(err, ErrLimit):
		return "limit_reached"
	case errors.Is(err, ErrPolicy):
		return "invalid_policy"
	case errors.Is(err, ErrInvalid):
		return "bad_request"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "internal"
}

// observe reports an operation to Config.Observe, if set.
func (m *Manager) observe(op, runtime string, err error, start time.Time) {
	if m.cfg.Observe == nil {
		return
	}
	if runtime == "" {
		runtime = "unknown"
	}
	m.cfg.Observe(Observation{Op: op, Runtime: runtime, Status: StatusOf(err), Duration: time.Since(start)})
}

// RuntimeOf returns the runtime of a sandbox this server holds, or "" if
// it holds none of that id.
func (m *Manager) RuntimeOf(id string) string {
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb == nil {
		return ""
	}
	return sb.runtimeName()
}

// Create starts a sandbox and connects to its agent.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (Info, error) {
	start := time.Now()
	info, err := m.create(ctx, req)
	rt := info.Runtime
	if rt == "" {
		if rt = req.Runtime; rt == "" {
			rt = string(m.cfg.DefaultRuntime)
		}
	}
	m.observe("create", rt, err, start)
	return info, err
}

// Pause stops every process of a running sandbox: a native one is frozen
// with the cgroup freezer (memory stays resident); a gvisor one is
// checkpointed to disk with runsc checkpoint (processes, memory, open
// files and its tmpfs /workspace and /tmp; the memory is freed) and
// restored by Resume; a microvm one is saved to disk by QEMU's migration
// to a file and its QEMU ends (tier.Checkpointer, as gvisor's). The TTL
// keeps counting. Pausing a paused sandbox is a no-op.
func (m *Manager) Pause(ctx context.Context, owner, id string) (Info, error) {
	return m.timedSetPaused(ctx, owner, id, true)
}

// Resume thaws a paused sandbox. Resuming a running one is a no-op.
func (m *Manager) Resume(ctx context.Context, owner, id string) (Info, error) {
	return m.timedSetPaused(ctx, owner, id, false)
}

func (m *Manager) timedSetPaused(ctx context.Context, owner, id string, on bool) (Info, error) {
	start := time.Now()
	info, err := m.setPaused(ctx, owner, id, on)
	op := "resume"
	if on {
		op = "pause"
	}
	rt := info.Runtime
	if rt == "" {
		rt = m.RuntimeOf(id)
	}
	m.observe(op, rt, err, start)
	return info, err
}

// observeEgress reports a finished (or refused) proxy connection.
func (m *Manager) observeEgress(r egress.Record) {
	if m.cfg.Observe == nil {
		return
	}
	status := "denied"
	if r.Allowed {
		status = "allowed"
	}
	rt := m.RuntimeOf(r.SandboxID)
	if rt == "" {
		rt = "unknown"
	}
	m.cfg.Observe(Observation{Op: "egress", Runtime: rt, Status: status, Duration: r.Duration})
}
