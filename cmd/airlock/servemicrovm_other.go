//go:build !linux

package main

import "flag"

// microvmFlags: the microvm tier is Linux-only.
func microvmFlags(fs *flag.FlagSet) func() error {
	fs.String("microvm-accel", "auto", "runtime microvm (Linux only)")
	return func() error { return nil }
}
