//go:build !linux

package main

import (
	"flag"

	rt "github.com/airlock-dev/airlock/runtime"
)

// microvmFlags: the microvm tier is Linux-only.
func microvmFlags(fs *flag.FlagSet) func() error {
	fs.String("microvm-accel", "auto", "runtime microvm (Linux only)")
	return func() error { return nil }
}

// doctorMicroVM: the microvm tier is Linux-only.
func doctorMicroVM() rt.Layer {
	return rt.Layer{Name: "microvm", State: rt.StateMissing, Detail: "--runtime microvm needs Linux"}
}
