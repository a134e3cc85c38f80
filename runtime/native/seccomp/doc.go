// Package seccomp compiles the seccomp-bpf filters that the native runtime
// installs in a sandboxed process right before execve.
//
// Filters are built with gVisor's pure-Go seccomp compiler, so the airlock
// binary stays CGO-free and static. Every filter allows by default and denies
// a fixed list of dangerous system calls; a call made through a foreign ABI
// (32-bit int $0x80, x32) kills the whole process.
//
// Three profiles exist: "strict" (the default), "standard" (currently equal
// to strict) and "light", which additionally lets debuggers work (ptrace,
// process_vm_readv/writev, kcmp, any personality, AF_NETLINK sockets).
//
// The filter is only available on linux/amd64; elsewhere Build returns an
// error.
package seccomp
