package microvm

// TCGKernelArgs are the kernel arguments of a guest under TCG: on a
// loaded host the kernel cannot calibrate its clocks against the emulated
// PIT and stalls, so it is given the TSC rate and the delay loop instead
// of measuring them.
const TCGKernelArgs = "tsc_early_khz=2000000 lpj=4000000 no_timer_check"

// GuestKernel returns the kernel the tier boots its guests with:
// KernelPath, else the newest Debian cloud kernel in /boot, else the
// newest /boot/vmlinuz-*. Other guests (the cgroup v2 test harness,
// internal/cgroup2vm) boot the same kernel.
func GuestKernel() (string, error) { return kernelPath() }

// KernelModules returns the host paths of the named modules of kernel
// (a /boot/vmlinuz-VERSION) and of their dependencies, dependencies
// first, in an order insmod can load them; modules built into the kernel
// are left out.
func KernelModules(kernel string, names ...string) ([]string, error) {
	mods, err := modulesOf(kernel, names)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(mods))
	for i, m := range mods {
		out[i] = m.path
	}
	return out, nil
}
