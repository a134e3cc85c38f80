//go:build !linux

package cgroups

// PidsLimitHits is not supported outside Linux.
func (g *Group) PidsLimitHits() (int64, error) { return 0, errNotLinux }
