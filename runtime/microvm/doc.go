// Package microvm is the microvm tier: each sandbox is a QEMU "microvm"
// guest with its own Linux kernel (Debian's cloud kernel from the host's
// /boot), booted from a small initramfs that airlock builds at first use
// (Initramfs): busybox, the virtio modules, the agent and an /init that
// execs the agent as the guest's PID 1 on a virtio-serial port. The
// guest kernel is the boundary: the workload's system calls never reach
// the host kernel, only QEMU's emulated devices do. QEMU runs under its
// own seccomp sandbox, in a cgroup of its own, with no network device.
//
// This is the first rung (issue 27): a root of busybox and a read-only
// /usr image of the host's python3 (UsrImage) or an image's layers
// (RootImage), exec, files, code cells, background processes, volumes,
// network through the egress proxy; pause to disk, memory snapshots and
// forks through QEMU's migration to a file (state_linux.go), the agent's
// stream carried across QEMU processes by a host-side relay (portRelay).
// A sandbox paused to disk is taken over paused after a server restart
// (Adopt); adopting a running one and the pool are declared missing in
// Caps; see docs/microvm.md.
package microvm
