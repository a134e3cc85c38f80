//go:build linux && !amd64

package seccomp

import (
	"fmt"
	"runtime"
)

// Placeholders so the package compiles; profileRules always fails here.
const (
	nativeAuditArch   = 0
	foreignSyscallBit = 0xffffffff
)

// profileRules reports that no rules are written for this architecture yet.
func profileRules(string, Guards) (ruleSets, error) {
	return ruleSets{}, fmt.Errorf("no seccomp rules for %s", runtime.GOARCH)
}
