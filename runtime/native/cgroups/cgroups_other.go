//go:build !linux

package cgroups

import (
	"errors"
	"fmt"
)

var errNotLinux = errors.New("cgroups: only supported on Linux")

// Detect reports that there are no cgroups outside Linux.
func Detect() Info {
	return Info{Reason: "cgroups need Linux"}
}

// Create always fails outside Linux, wrapping ErrControllerMissing.
func Create(name string, l Limits) (*Group, error) {
	return nil, fmt.Errorf("cgroups: create airlock/%s: %w: cgroups need Linux", name, ErrControllerMissing)
}

// Lookup always fails outside Linux.
func Lookup(name string) (*Group, error) { return nil, errNotLinux }

// Add is not supported outside Linux.
func (g *Group) Add(pid int) error { return errNotLinux }

// Stats is not supported outside Linux.
func (g *Group) Stats() (Stats, error) { return Stats{}, errNotLinux }

// Kill is not supported outside Linux.
func (g *Group) Kill() error { return errNotLinux }

// Destroy is not supported outside Linux.
func (g *Group) Destroy() error { return errNotLinux }

// CleanupStale has nothing to clean outside Linux.
func CleanupStale(keep func(name string) bool) ([]string, error) { return nil, nil }
