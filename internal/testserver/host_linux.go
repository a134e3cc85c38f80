package testserver

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

// HostProcesses counts the host's processes (in any namespace) whose
// command line contains marker.
func HostProcesses(marker string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline"); strings.Contains(string(b), marker) {
			n++
		}
	}
	return n
}

// RunCgroups lists the cgroups of the one-shot runs (`airlock run`) of
// launcher process pid: what must be gone once it exits.
func RunCgroups(pid int) []string {
	tag := "run-" + strconv.Itoa(pid) + "-"
	var found []string
	for _, base := range []string{"/sys/fs/cgroup/memory/airlock", "/sys/fs/cgroup/pids/airlock", "/sys/fs/cgroup/airlock", cgroups.Detect().Root} {
		ents, _ := os.ReadDir(base)
		for _, e := range ents {
			if strings.Contains(e.Name(), tag) {
				found = append(found, filepath.Join(base, e.Name()))
			}
		}
	}
	return found
}
