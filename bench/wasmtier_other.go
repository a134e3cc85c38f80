//go:build !linux

package bench

import "time"

// WasmFigures reports the wasm tier's figures unavailable: it needs Linux.
func WasmFigures(exe, scratch string, runs int, timeout time.Duration) []Figure {
	return []Figure{Unavailable("wasm cold start", "the wasm tier is built for Linux only")}
}
