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
		if err := h.suspend(image); err != nil {
			if errors.Is(err, gvisor.ErrNetworkSnapshot) {
				return fmt.Errorf("%w: %w", ErrPolicy, err)
			}
			return err
		}
		// The image is whole: a server restarted from here can resume it.
		if err := os.WriteFile(m.checkpointDone(sb.ID), nil, 0o600); err != nil {
			m.cfg.Logf("sandbox %s: mark its checkpoint complete: %v (it will not survive a restart while paused)", sb.ID, err)
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
