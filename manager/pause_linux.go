package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"airlock/runtime/gvisor"
	"airlock/runtime/native/cgroups"
)

// setFrozen pauses (on) or resumes sb: a gvisor sandbox this process
// started is checkpointed to disk and restored; any other is frozen and
// thawed.
func (m *Manager) setFrozen(sb *Sandbox, on bool) error {
	h, ok := gvisorOf(sb)
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
		if err := h.suspend(tmp); err != nil {
			os.RemoveAll(tmp)
			if errors.Is(err, gvisor.ErrNetworkSnapshot) {
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
	if err := h.resume(image, log); err != nil {
		h.end() // nothing runs any more: the sandbox ends as exited
		return fmt.Errorf("manager: restore sandbox %s: %w", sb.ID, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sb.client.Ping(ctx); err != nil {
		return fmt.Errorf("manager: the restored agent of %s does not answer: %w", sb.ID, err)
	}
	return os.RemoveAll(image)
}

// freeze freezes (on) or thaws the sandbox's cgroup, named after its id
// for both runtimes.
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

// settleCheckpoint decides, on restart, whether gvisor sandbox id can be
// taken over paused, and returns why not (empty if it can). A sandbox with
// a committed image can. One whose pause the previous server was killed in
// the middle of (checkpoint.tmp, no checkpoint.done) can when the runsc
// checkpoint, which outlived the server, wrote the whole image: the image
// is then committed here. A half-written image is discarded, and the
// sandbox is recorded lost with the reason; a running gvisor sandbox
// cannot be taken over (its agent was connected to the previous server
// over a socketpair).
func (m *Manager) settleCheckpoint(id string) string {
	image, done := m.checkpointDir(id), m.checkpointDone(id)
	tmp := image + ".tmp"
	if _, err := os.Stat(done); err == nil {
		os.RemoveAll(tmp)
		return ""
	}
	if _, err := os.Stat(tmp); err != nil {
		return "gvisor sandboxes are not reattached after a restart unless paused (their agent was connected to the previous server over a socketpair)"
	}
	whole, err := gvisor.FinishCheckpoint(id, tmp, interruptedCheckpointWait)
	if err != nil || !whole {
		os.RemoveAll(tmp)
		why := "the server was killed while pausing it, before its checkpoint was written"
		if err != nil {
			why += ": " + err.Error()
		}
		return why
	}
	if err := commitCheckpoint(tmp, image, done); err != nil {
		os.RemoveAll(tmp)
		return "the server was killed while pausing it; committing its checkpoint: " + err.Error()
	}
	m.cfg.Logf("sandbox %s: its pause, interrupted by the previous server's end, completed", id)
	return ""
}
