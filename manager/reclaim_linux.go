package manager

import (
	"os"
	"path/filepath"

	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/idrange"
)

// reclaimLeftovers removes what a previous server process killed with
// SIGKILL left beside its sandboxes: the ready disks of its pool (on
// start, not when the first image sandbox opens the pool, so that a crash
// leaves nothing mounted past the next start), the roots and cgroups of
// its template builds' RUN steps, and dead holders' host id range leases.
func (m *Manager) reclaimLeftovers() {
	if err := native.ReclaimDiskPool(filepath.Join(m.cfg.StateDir, "diskpool")); err != nil {
		m.cfg.Logf("image roots: remove the ready disks of a previous run: %v", err)
	}
	// The RUN steps of template builds the previous process ran: their
	// roots (upper disks mounted) and their cgroups.
	for _, r := range native.SweepRoots(filepath.Join(m.cfg.StateDir, "roots")) {
		m.cfg.Logf("image roots: removed %s, left by a build of a previous run", r)
		if m.cfg.Images != nil {
			if err := m.cfg.Images.Release(filepath.Base(r)); err != nil {
				m.cfg.Logf("image roots: %v", err)
			}
		}
	}
	if _, err := native.CleanupOrphans(); err != nil {
		m.cfg.Logf("recovery: cgroups of one-shot runs: %v", err)
	}
	// Host id ranges whose holder (a lost sandbox's init, a build) died.
	if os.Geteuid() == 0 {
		if pool, err := idrange.Default(); err == nil {
			if _, err := pool.Reap(); err != nil {
				m.cfg.Logf("recovery: host id range leases: %v", err)
			}
		}
	}
}
