//go:build linux && amd64

package main

// int80Getpid makes getpid (i386 number 20) through int $0x80, the 32-bit
// system call gate, and returns the result. Implemented in probe_amd64.s.
func int80Getpid() int64
