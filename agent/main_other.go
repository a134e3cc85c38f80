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

// MainListen runs the agent in listen mode; elsewhere than Linux it reports
// that the agent is Linux-only and exits with status 2.
func MainListen(ListenConfig) { Main() }
