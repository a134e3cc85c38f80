//go:build !linux

package gvisor

import "fmt"

// Runsc describes the runsc binary airlock uses.
type Runsc struct {
	Path    string
	Version string
}

// Find reports that gVisor needs Linux.
func Find() (Runsc, error) {
	return Runsc{}, fmt.Errorf("%w: gVisor runs on Linux only", ErrUnavailable)
}

// Available reports that gVisor needs Linux.
func Available() (Runsc, error) { return Find() }

// Remove has nothing to remove off Linux.
func Remove(id string) error { return nil }
