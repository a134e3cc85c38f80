//go:build linux && !amd64

package seccomp

// No filters are precompiled for this platform: Build compiles them.
var precompiled = map[string]precompiledFilter{}
