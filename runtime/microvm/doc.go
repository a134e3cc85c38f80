// Package microvm is the microvm tier: each sandbox is a QEMU "microvm"
// guest with its own Linux kernel (Debian's cloud kernel from the host's
// /boot), booted from a small initramfs that airlock builds at first use
// (Initramfs): busybox, the virtio modules, the agent and an /init that
// execs the agent as the guest's PID 1 on a virtio-serial port. The
// guest kernel is the boundary: the workload's system calls never reach
// the host kernel, only QEMU's emulated devices do. QEMU runs under its
// own seccomp sandbox, in a cgroup of its own, with no network device.
//
// This is the first rung (issue 27): a host-default-like root (busybox,
// no host /usr), exec, files and background processes. Image roots,
// volumes, network, pause, snapshots and adoption are declared missing in
// Caps and refused by the manager; see docs/microvm.md.
package microvm
