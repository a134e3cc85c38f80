//go:build !linux

package bench

import (
	"errors"
	"os/exec"
)

// nsThread is only implemented on Linux.
type nsThread struct{}

// newNSThread fails outside Linux.
func newNSThread(string) (*nsThread, error) { return nil, errors.New("mount namespaces need Linux") }

// start starts cmd.
func (t *nsThread) start(cmd *exec.Cmd) error { return cmd.Start() }

// close does nothing.
func (t *nsThread) close() {}

// detectHybrid reports false outside Linux.
func detectHybrid() bool { return false }

// unmountUnder is a no-op outside Linux.
func unmountUnder(string) {}

// kernelRelease is unknown outside Linux.
func kernelRelease() string { return "unknown" }

// cgroupLayout is "none" outside Linux.
func cgroupLayout() string { return "none" }

// sameMM is only known on Linux.
func sameMM(a, b int) bool { return false }
