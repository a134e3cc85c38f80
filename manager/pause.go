package manager

import (
	"context"
	"errors"
	"fmt"
)

// ErrPaused is returned (wrapped) for a request a paused sandbox cannot
// serve until it is resumed.
var ErrPaused = errors.New("sandbox is paused")

// Lookup returns a running sandbox owned by owner. A paused one is refused
// (ErrNotRunning and ErrPaused): its agent cannot answer until resumed.
// Kill, SetTimeout, Metrics, SetNetwork and Resume take paused sandboxes.
func (m *Manager) Lookup(owner, id string) (*Sandbox, error) {
	sb, err := m.lookupAny(owner, id)
	if err == nil && sb.Paused() {
		return nil, fmt.Errorf("%w: %w: resume it first", ErrNotRunning, ErrPaused)
	}
	return sb, err
}

// Paused reports whether the sandbox is frozen by Pause.
func (s *Sandbox) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

// Pause stops every process of a running sandbox: a native one is frozen
// with the cgroup freezer (memory stays resident); a gvisor one is
// checkpointed to disk with runsc checkpoint (processes, memory, open
// files and its tmpfs /workspace and /tmp; the memory is freed) and
// restored by Resume. The TTL keeps counting. Pausing a paused sandbox is
// a no-op.
func (m *Manager) Pause(ctx context.Context, owner, id string) (Info, error) {
	return m.setPaused(ctx, owner, id, true)
}

// Resume thaws a paused sandbox. Resuming a running one is a no-op.
func (m *Manager) Resume(ctx context.Context, owner, id string) (Info, error) {
	return m.setPaused(ctx, owner, id, false)
}

func (m *Manager) setPaused(ctx context.Context, owner, id string, on bool) (Info, error) {
	sb, err := m.lookupAny(owner, id)
	if err != nil {
		return Info{}, err
	}
	action := "sandbox.resume"
	if on {
		action = "sandbox.pause"
	}
	if err := m.AuditFirst(ctx, owner, id, action, nil); err != nil {
		return Info{}, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.paused == on {
		return infoLocked(sb), nil
	}
	if sb.ending {
		return Info{}, fmt.Errorf("%w: ending", ErrNotRunning)
	}
	if err := m.setFrozen(sb, on); err != nil {
		return Info{}, err
	}
	sb.paused = on
	return infoLocked(sb), nil
}

// thawForEnd thaws a paused sandbox that is being ended (frozen processes
// do not die of SIGKILL until thawed) and keeps it from being paused
// again.
func (sb *Sandbox) thawForEnd() {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.ending = true
	if sb.paused {
		if err := freeze(sb.ID, false); err != nil {
			sb.m.cfg.Logf("sandbox %s: thaw before kill: %v", sb.ID, err)
		}
		sb.paused = false
	}
}

// infoLocked is sb.info() for a caller holding sb.mu.
func infoLocked(sb *Sandbox) Info {
	in := infoFromRecord(&sb.rec)
	in.Reattached, in.Enforced, in.Paused = sb.reattached, sb.enforced, sb.paused
	return in
}
