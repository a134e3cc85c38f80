package testserver

import (
	"os"
	"path/filepath"
	"strings"
)

// HostLeftovers lists what of a server with state directory state the host
// still holds, seen from this mount namespace: mount points under state,
// loop devices whose backing file is under state (a deleted one too), and
// entries of the image store's tmp/. keep names sandbox ids whose own
// mounts and disks are expected (live sandboxes).
func HostLeftovers(state string, keep ...string) []string {
	state, _ = filepath.Abs(state)
	kept := func(p string) bool {
		for _, id := range keep {
			if strings.HasPrefix(p, filepath.Join(state, "sandboxes", id)+"/") || p == filepath.Join(state, "sandboxes", id) {
				return true
			}
		}
		return false
	}
	var out []string
	keptLoop := map[string]bool{} // loop devices mounted in a kept sandbox
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 5 {
				continue
			}
			mp := strings.ReplaceAll(f[4], `\040`, " ")
			if mp != state && !strings.HasPrefix(mp, state+"/") {
				continue
			}
			if kept(mp) {
				for i, x := range f {
					if x == "-" && i+2 < len(f) {
						keptLoop[filepath.Base(f[i+2])] = true
					}
				}
				continue
			}
			out = append(out, "mount "+mp)
		}
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range backing {
		f, _ := os.ReadFile(b)
		name := strings.TrimSuffix(strings.TrimSpace(string(f)), " (deleted)")
		dev := filepath.Base(filepath.Dir(filepath.Dir(b)))
		if strings.HasPrefix(name, state+"/") && !keptLoop[dev] && !kept(name) {
			out = append(out, "loop device "+dev+" on "+strings.TrimSpace(string(f)))
		}
	}
	ents, _ := os.ReadDir(filepath.Join(state, "images", "tmp"))
	for _, e := range ents {
		out = append(out, "temp file "+filepath.Join(state, "images", "tmp", e.Name()))
	}
	return out
}
