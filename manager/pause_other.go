//go:build !linux

package manager

import "net"

func freeze(id string, on bool) error { return errNotLinux }

func (m *Manager) setFrozen(sb *Sandbox, on bool) error { return errNotLinux }

func (m *Manager) snapshotImage(sb *Sandbox, image string) error { return errNotLinux }

func instListeners(sb *Sandbox) ([]net.Listener, bool) { return nil, false }
