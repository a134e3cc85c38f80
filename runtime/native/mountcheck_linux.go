package native

import (
	"fmt"
	"os"
	"syscall"

	"github.com/airlock-dev/airlock/policy"
)

// checkWritableMounts refuses a read-write mount whose source the sandbox
// user could not write: where attachHostDirs made no ID-mapped mount
// (unprivileged airlock, a world-writable root directory) the sandbox
// writes as its host uid, so a directory owned by someone else would be
// mounted "read-write" and fail every write. The error says what to do.
func checkWritableMounts(mounts []policy.Mount, ids idMap) error {
	for _, m := range mounts {
		if !m.Writable {
			continue
		}
		fi, err := os.Stat(m.Source)
		if err != nil {
			return fmt.Errorf("mount %s: %w", m.Source, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		perm := uint32(fi.Mode().Perm())
		var can bool
		switch {
		case int(st.Uid) == ids.hostUID:
			can = perm&0o200 != 0
		case int(st.Gid) == ids.hostGID:
			can = perm&0o020 != 0
		default:
			can = perm&0o002 != 0
		}
		if can {
			continue
		}
		return fmt.Errorf("mount %s at %s read-write: the sandbox user (host uid %d, gid %d) cannot write %s (owned by uid %d, gid %d, mode %04o); "+
			"airlock ID-maps a host directory's owner onto the sandbox user only when it runs as root; make it writable for the sandbox (chmod -R o+rwX %s), mount it read-only (drop :rw), "+
			"or use --workspace with a directory that does not exist yet (airlock creates it owned by the sandbox user and reuses that owner on later runs)",
			m.Source, m.Target, ids.hostUID, ids.hostGID, m.Source, st.Uid, st.Gid, perm, m.Source)
	}
	return nil
}
