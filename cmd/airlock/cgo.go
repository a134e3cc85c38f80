package main

import (
	"errors"
	"runtime/debug"
)

// errCgoBuild is why serve and mcp refuse a binary built with cgo: the
// agent (this binary, PID 1 of every live sandbox) drops its capabilities
// on all of its threads with syscall.AllThreadsSyscall, which a cgo build
// does not support, so every sandbox would die at start.
var errCgoBuild = errors.New("this airlock binary was built with cgo (CGO_ENABLED=1), " +
	"and the in-sandbox agent needs a static build: rebuild with CGO_ENABLED=0 go build -o bin/airlock ./cmd/airlock")

// checkStaticBuild reports errCgoBuild when the build settings say cgo was
// enabled.
func checkStaticBuild(settings []debug.BuildSetting) error {
	for _, s := range settings {
		if s.Key == "CGO_ENABLED" && s.Value == "1" {
			return errCgoBuild
		}
	}
	return nil
}

// requireStaticBuild checks the running binary's own build settings.
func requireStaticBuild() error {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	return checkStaticBuild(bi.Settings)
}
