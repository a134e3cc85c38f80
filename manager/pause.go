package manager

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrPaused is returned (wrapped) for a request a paused sandbox cannot
// serve until it is resumed.
var ErrPaused = errors.New("sandbox is paused")

// Lookup returns a running sandbox owned by owner. A paused one is refused
// (ErrNotRunning and ErrPaused): its agent cannot answer until resumed.
// Kill, SetTimeout, Metrics, SetNetwork and Resume take paused sandboxes.
func (m *Manager) Lookup(owner, id string) (*Sandbox, error) {
	if m.remote() {
		return m.lookupRemote(owner, id)
	}
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

func (m *Manager) setPaused(ctx context.Context, owner, id string, on bool) (Info, error) {
	if m.remote() {
		return m.setPausedRemote(ctx, owner, id, on)
	}
	sb, err := m.lookupAny(owner, id)
	if err != nil {
		return Info{}, err
	}
	if err := m.AuditFirst(ctx, owner, id, pauseAction(on), nil); err != nil {
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

// pauseAction is the audit action of Pause (on) or Resume.
func pauseAction(on bool) string {
	if on {
		return "sandbox.pause"
	}
	return "sandbox.resume"
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

// OnTimeoutKey is the metadata label that chooses what the end of a
// sandbox's TTL does: "pause" pauses it (as Pause does) instead of killing
// it, and gives it Config.MaxTimeout more, paused, to be resumed in
// (resuming does not extend it: set a new timeout); when that passes too it
// is killed. "kill", or no label, kills it (the default).
const OnTimeoutKey = "airlock.on_timeout"

// PauseMemoryKey is the metadata label that, set to "false" next to
// OnTimeoutKey=pause, makes the pause at the end of the TTL
// filesystem-only: every process of the sandbox is killed first (their
// memory is freed; its files stay), on any tier.
const PauseMemoryKey = "airlock.pause_memory"

// pauseRetryWindow is how long after its TTL the reaper keeps trying to
// pause a sandbox labelled OnTimeoutKey=pause whose pause failed for a
// transient cause, before it kills it.
const pauseRetryWindow = 30 * time.Second

// pauseOnTimeout pauses an expired sandbox labelled OnTimeoutKey=pause and
// reports whether it did; false means the sandbox is to be killed (no
// label, already paused, ending, or the pause failed).
func (m *Manager) pauseOnTimeout(sb *Sandbox) bool {
	sb.mu.Lock()
	fsOnly := sb.rec.Metadata[OnTimeoutKey] == "pause" && sb.rec.Metadata[PauseMemoryKey] == "false" && !sb.paused && !sb.ending
	sb.mu.Unlock()
	if fsOnly && sb.client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := sb.client.KillProcesses(ctx); err != nil {
			m.cfg.Logf("sandbox %s: filesystem-only pause at the end of its timeout: killing its processes: %v; pausing it with them", sb.ID, err)
		}
		cancel()
	}
	sb.mu.Lock()
	if sb.rec.Metadata[OnTimeoutKey] != "pause" || sb.paused || sb.ending {
		sb.mu.Unlock()
		return false
	}
	if err := m.setFrozen(sb, true); err != nil {
		late := time.Since(sb.rec.ExpiresAt)
		sb.mu.Unlock()
		if !errors.Is(err, ErrPolicy) && late < pauseRetryWindow {
			// A transient failure (a task that did not reach the
			// freezer in time on a loaded host): the sandbox is intact
			// and running; the reaper tries again on its next pass
			// rather than kill it and lose its files.
			m.cfg.Logf("sandbox %s: pause at the end of its timeout: %v; trying again", sb.ID, err)
			return true
		}
		m.cfg.Logf("sandbox %s: pause at the end of its timeout: %v; killing it instead", sb.ID, err)
		return false
	}
	sb.paused = true
	at := time.Now().Add(m.cfg.MaxTimeout).UTC()
	sb.rec.ExpiresAt = at
	sb.mu.Unlock()
	if err := m.st.SetExpiry(context.Background(), sb.ID, at); err != nil {
		m.cfg.Logf("sandbox %s: paused at timeout, but recording its new expiry: %v", sb.ID, err)
	}
	m.Audit(context.Background(), "", sb.ID, "sandbox.pause", map[string]string{"reason": "expired"})
	return true
}
