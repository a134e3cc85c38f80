//go:build !linux

package manager

// freeIDs: host id ranges exist on Linux only.
func (m *Manager) freeIDs(base int) {}
