package native

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/airlock-dev/airlock/runtime/native/cgroups"
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

// SweepRoots removes the image roots (upper disk unmounted, directory
// removed) that one-shot runs named run-<launcher pid>-... left in dir
// when their launcher died without cleaning up: `airlock run --image`, or
// a template build's RUN step in a server killed with SIGKILL. Roots of
// live launchers are kept. It returns the roots it removed.
func SweepRoots(dir string) []string {
	var removed []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), runIDPrefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		if pid, err := strconv.Atoi(pidStr); err == nil && pid > 0 && pid != os.Getpid() {
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				if RemoveImageRoot(filepath.Join(dir, e.Name())) == nil {
					removed = append(removed, filepath.Join(dir, e.Name()))
				}
			}
		}
	}
	return removed
}
