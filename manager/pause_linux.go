package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// setFrozen pauses (on) or resumes sb as its tier does: a Checkpointer
// (PauseCheckpoint) is saved to disk and restored; any other is frozen and
// thawed.
func (m *Manager) setFrozen(sb *Sandbox, on bool) error {
	ck, ok := sb.inst.(tier.Checkpointer)
	if !ok {
		return freeze(sb.ID, on)
	}
	image := m.checkpointDir(sb.ID)
	if on {
		// The image is written beside (checkpoint.tmp) and renamed into
		// place once whole and on disk; checkpoint.done then commits it.
		// runsc stops the sandbox only after writing it. A server killed
		// in between leaves checkpoint.tmp, which the next one settles
		// (settleCheckpoint).
		tmp := image + ".tmp"
		if err := os.RemoveAll(tmp); err != nil {
			return fmt.Errorf("manager: checkpoint: %w", err)
		}
		if err := ck.Suspend(tmp); err != nil {
			os.RemoveAll(tmp)
			if errors.Is(err, tier.ErrNotSupported) {
				return fmt.Errorf("%w: %w", ErrPolicy, err)
			}
			return err
		}
		if err := commitCheckpoint(tmp, image, m.checkpointDone(sb.ID)); err != nil {
			m.cfg.Logf("sandbox %s: commit its checkpoint: %v (it will not survive a restart while paused)", sb.ID, err)
		}
		return nil
	}
	os.Remove(m.checkpointDone(sb.ID))
	log, err := agentLog(filepath.Join(m.dir, sb.ID, "agent.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	if err := ck.Resume(image, log); err != nil {
		ck.End() // nothing runs any more: the sandbox ends as exited
		return fmt.Errorf("manager: restore sandbox %s: %w", sb.ID, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sb.client.Ping(ctx); err != nil {
		return fmt.Errorf("manager: the restored agent of %s does not answer: %w", sb.ID, err)
	}
	// The restore is a new host process: record it, so that a server
	// restarted from here finds (adopts) this one, not the checkpointed one.
	if err := m.recordPidLocked(ctx, sb); err != nil {
		m.cfg.Logf("sandbox %s: record its restored process: %v (a server restart will lose it)", sb.ID, err)
	}
	return os.RemoveAll(image)
}

// recordPidLocked stores sb's current host pid and its start time in its
// record's runtime state; sb.mu is held.
func (m *Manager) recordPidLocked(ctx context.Context, sb *Sandbox) error {
	var rs runtimeState
	if err := json.Unmarshal(sb.rec.Runtime, &rs); err != nil {
		return fmt.Errorf("runtime state: %w", err)
	}
	rs.Pid = sb.inst.Pid()
	st, err := native.ProcStartTime(rs.Pid)
	if err != nil {
		return fmt.Errorf("start time of pid %d: %w", rs.Pid, err)
	}
	rs.StartTime = st
	raw, err := json.Marshal(rs)
	if err != nil {
		return err
	}
	rec := sb.rec
	rec.InitPID, rec.Runtime = rs.Pid, raw
	if err := m.st.PutSandbox(ctx, &rec); err != nil {
		return err
	}
	sb.rec = rec
	return nil
}

// checkpointDir is where a suspended sandbox's checkpoint image lives.
func (m *Manager) checkpointDir(id string) string { return filepath.Join(m.dir, id, "checkpoint") }

// checkpointDone marks the checkpoint image of a paused sandbox as
// complete.
func (m *Manager) checkpointDone(id string) string {
	return filepath.Join(m.dir, id, "checkpoint.done")
}

// instListeners returns the proxy listeners that the adoption of a paused
// sandbox opened in its new egress namespace, if any.
func instListeners(sb *Sandbox) ([]net.Listener, bool) {
	l, ok := sb.inst.(tier.Listening)
	if !ok {
		return nil, false
	}
	ls := l.Listeners()
	return ls, len(ls) > 0
}

// snapshotImage snapshots sb to image, leaving it running, if its tier
// declares MemorySnapshot.
func (m *Manager) snapshotImage(sb *Sandbox, image string) error {
	ck, ok := sb.inst.(tier.Checkpointer)
	if !ok || ck.Conn() == nil {
		return fmt.Errorf("%w: sandbox %s has no memory snapshot (its runtime does not checkpoint, or another server started it)", ErrPolicy, sb.ID)
	}
	sb.mu.Lock()
	defer sb.mu.Unlock() // no pause meanwhile
	if sb.paused || sb.ending {
		return fmt.Errorf("%w: paused or ending", ErrNotRunning)
	}
	if err := os.MkdirAll(filepath.Dir(image), 0o700); err != nil {
		return fmt.Errorf("manager: snapshot: %w", err)
	}
	if err := ck.Snapshot(image); err != nil {
		os.RemoveAll(image)
		if errors.Is(err, tier.ErrNotSupported) {
			return fmt.Errorf("%w: %w", ErrPolicy, err)
		}
		return fmt.Errorf("manager: snapshot of %s: %w", sb.ID, err)
	}
	return nil
}

// freeze freezes (on) or thaws the sandbox's cgroup, named after its id
// for every tier.
func freeze(id string, on bool) error {
	g, err := cgroups.Lookup(id)
	if err != nil {
		return fmt.Errorf("manager: pause needs the sandbox's cgroup: %w", err)
	}
	if on {
		return g.Freeze()
	}
	return g.Thaw()
}

// commitCheckpoint moves the whole, synced image tmp to image and marks it
// complete with done, each step on disk before the next: a crash leaves
// either tmp (settled on restart) or image with or without done.
func commitCheckpoint(tmp, image, done string) error {
	if err := os.RemoveAll(image); err != nil {
		return err
	}
	if err := os.Rename(tmp, image); err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(image)); err != nil {
		return err
	}
	f, err := os.OpenFile(done, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(done))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// interruptedCheckpointWait bounds how long a restarted server waits for
// the runsc checkpoint that its crashed predecessor left running.
const interruptedCheckpointWait = 2 * time.Minute

// settleCheckpoint decides, on restart, whether sandbox id of tier t (a
// PauseCheckpoint tier) is taken over paused, and returns why it is lost
// (empty if it is not). A sandbox with a committed image is paused. One
// whose pause the previous server was killed in the middle of
// (checkpoint.tmp, no checkpoint.done) is when the checkpoint, which
// outlived the server, wrote the whole image (tier.CheckpointSettler): the
// image is then committed here. One whose checkpoint never began runs on:
// what is in checkpoint.tmp is discarded and it is not paused. Only one
// whose checkpoint does not settle (still running, or its sandbox still
// up after writing it) is recorded lost, with the reason. Without a pause
// under way it is not paused (adopted running if the tier can).
func (m *Manager) settleCheckpoint(t tier.Tier, id string) (paused bool, why string) {
	image, done := m.checkpointDir(id), m.checkpointDone(id)
	tmp := image + ".tmp"
	if _, err := os.Stat(done); err == nil {
		os.RemoveAll(tmp)
		return true, ""
	}
	if _, err := os.Stat(tmp); err != nil {
		return false, "" // no pause was under way
	}
	whole, err := false, error(nil)
	if s, ok := t.(tier.CheckpointSettler); ok {
		whole, err = s.FinishCheckpoint(id, tmp, interruptedCheckpointWait)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return false, "the server was killed while pausing it, and its checkpoint did not settle: " + err.Error()
	}
	if !whole {
		// The checkpoint never began: the sandbox runs on, and is taken
		// over running (a sandbox is never dropped for a pause that did
		// not happen; if it is gone, adoption says so).
		os.RemoveAll(tmp)
		m.cfg.Logf("sandbox %s: its pause, interrupted by the previous server's end, never began; taken over running", id)
		return false, ""
	}
	if err := commitCheckpoint(tmp, image, done); err != nil {
		os.RemoveAll(tmp)
		return false, "the server was killed while pausing it; committing its checkpoint: " + err.Error()
	}
	m.cfg.Logf("sandbox %s: its pause, interrupted by the previous server's end, completed", id)
	return true, ""
}
