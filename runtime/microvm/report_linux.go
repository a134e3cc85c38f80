package microvm

import (
	"fmt"
	"os"
)

// Report is what airlock doctor says of the tier on this host.
type Report struct {
	// Accel is the accelerator sandboxes will use ("kvm" or "tcg"), and
	// Why the reason (the KVM probe's outcome, or the operator's choice).
	Accel, Why string
	// Kernel is the guest kernel.
	Kernel string
	// Initramfs is the cached initramfs for agentBinary, and Cached whether
	// it is built already (else the first sandbox builds it).
	Initramfs string
	Cached    bool
}

// Describe reports the accelerator (running the KVM probe once per
// process under auto), the guest kernel and whether the initramfs of
// agentBinary is cached. It fails as Available does, or when --microvm-accel
// kvm was asked for and KVM cannot run a guest.
func Describe(agentBinary string) (Report, error) {
	if err := (Tier{}).Available(); err != nil {
		return Report{}, err
	}
	k, err := kernelPath()
	if err != nil {
		return Report{}, err
	}
	acc, err := chooseAccel()
	if err != nil {
		return Report{}, err
	}
	r := Report{Accel: acc.accel, Why: acc.why, Kernel: k}
	b, err := os.ReadFile(agentBinary)
	if err != nil {
		return r, fmt.Errorf("microvm: agent binary: %w", err)
	}
	r.Initramfs = initramfsPath(k, b)
	_, err = os.Stat(r.Initramfs)
	r.Cached = err == nil
	return r, nil
}
