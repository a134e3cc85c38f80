//go:build !linux

package agent

import (
	"fmt"
	"os"
)

// Main runs the agent; the agent exists only on Linux, so elsewhere it
// reports that and exits with status 2.
func Main() {
	fmt.Fprintln(os.Stderr, "airlock agent: only supported on linux")
	os.Exit(2)
}
