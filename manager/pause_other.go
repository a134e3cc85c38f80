//go:build !linux

package manager

func freeze(id string, on bool) error { return errNotLinux }
