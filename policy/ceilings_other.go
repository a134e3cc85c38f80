//go:build !linux

package policy

import "errors"

// HostCeilings is only implemented on Linux.
func HostCeilings() (Ceilings, error) { return Ceilings{}, errors.New("host ceilings: Linux only") }
