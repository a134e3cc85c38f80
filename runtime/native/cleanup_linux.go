package native

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"airlock/runtime/native/cgroups"
)

// runIDPrefix marks the cgroups of one-shot runs: run-<launcher pid>-<random>.
const runIDPrefix = "run-"

// NewRunID returns an id for a one-shot sandbox that names its launcher, so
// that a later cleanup pass can tell whether the launcher is still alive.
func NewRunID() string {
	return fmt.Sprintf("%s%d-%s", runIDPrefix, os.Getpid(), strings.TrimPrefix(NewID(), "sb-"))
}

// CleanupOrphans removes the cgroups of one-shot runs whose launcher died
// without cleaning up (killed with SIGKILL, say). Groups of live launchers
// and of server sandboxes are kept; the server cleans its own on start.
func CleanupOrphans() ([]string, error) {
	return cgroups.CleanupStale(func(name string) bool {
		rest, ok := strings.CutPrefix(name, runIDPrefix)
		if !ok {
			return true
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil {
			return false
		}
		return syscall.Kill(pid, 0) == nil || pid == os.Getpid()
	})
}
