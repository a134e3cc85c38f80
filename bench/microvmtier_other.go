//go:build !linux

package bench

import "time"

// MicroVMFigure reports the microvm tier's figure unavailable: it needs
// Linux.
func MicroVMFigure(exe, scratch string, runs int, timeout time.Duration) Figure {
	return Unavailable("microvm cold start", "the microvm tier is built for Linux only")
}
