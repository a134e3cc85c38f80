//go:build !linux

package bench

import "time"

// DesktopFigures needs Linux (sandboxes, the desktop image's build).
func DesktopFigures(exe, scratch, cacheDir string, runs int, timeout time.Duration, progress func(string, ...any)) []Figure {
	return []Figure{Unavailable("desktop: create to first screenshot", "needs Linux"), Unavailable("desktop: screenshot", "needs Linux")}
}
