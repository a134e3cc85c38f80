package main

import (
	"flag"
	"fmt"
	"os"

	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/microvm"
)

// microvmFlags registers the flags of the microvm tier (serve, run, doctor)
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

// doctorMicroVM reports the microvm tier (--runtime microvm): the
// accelerator sandboxes get and why, the guest kernel, and whether the
// initramfs of this binary is built. The tier is optional: its absence
// does not fail the doctor.
func doctorMicroVM() rt.Layer {
	self, err := os.Executable()
	if err != nil {
		return rt.Layer{Name: "microvm", State: rt.StateMissing, Detail: "locate own binary: " + oneLine(err)}
	}
	r, err := microvm.Describe(self)
	if err != nil {
		return rt.Layer{Name: "microvm", State: rt.StateMissing, Detail: "--runtime microvm unavailable (optional): " + oneLine(err)}
	}
	state, note := rt.StateOK, ""
	if r.Accel == microvm.AccelTCG {
		state, note = rt.StateDegraded, " (every guest instruction is translated: slow)"
	}
	ird := "initramfs " + r.Initramfs + " built"
	if !r.Cached {
		ird = "initramfs not built yet (the first microvm sandbox builds it in " + microvm.CacheDir + ")"
	}
	return rt.Layer{Name: "microvm", State: state, Detail: fmt.Sprintf("%s%s; kernel %s; %s", r.Why, note, r.Kernel, ird)}
}
