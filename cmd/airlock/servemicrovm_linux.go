package main

import (
	"flag"
	"fmt"

	"airlock/runtime/microvm"
)

// microvmFlags registers serve's flags of the microvm tier
// (docs/microvm.md) and returns what applies them after parsing.
func microvmFlags(fs *flag.FlagSet) func() error {
	accel := fs.String("microvm-accel", microvm.AccelAuto, "runtime microvm: how guests run: auto (KVM if a probe guest boots on it, else TCG emulation), kvm or tcg (docs/microvm.md)")
	return func() error {
		switch *accel {
		case microvm.AccelAuto, microvm.AccelKVM, microvm.AccelTCG:
			microvm.Accel = *accel
			return nil
		}
		return fmt.Errorf("--microvm-accel: unknown %q (want auto, kvm or tcg)", *accel)
	}
}
