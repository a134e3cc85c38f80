// Package tiers registers airlock's built-in isolation tiers (native, wasm,
// gvisor) with package tier. Import it for its side effect, from a main
// package or a test:
//
//	import _ "github.com/airlock-dev/airlock/runtime/tiers"
package tiers
