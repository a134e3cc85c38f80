package native

import (
	"fmt"
	"os"
	"strconv"
)

// DefaultUIDBase is the first host uid of the range that sandbox uids
// 0-65535 map to when airlock runs as root. It sits far above the ranges
// that useradd and /etc/subuid hand out. AIRLOCK_UID_BASE overrides it.
const DefaultUIDBase = 1_500_000_000

// idMap is how sandbox ids map onto host ids.
type idMap struct {
	uidMap, gidMap string
	setgroups      bool // setgroups may be called (only when airlock is root)
	hostUID        int  // host uid of the sandbox user
	hostGID        int
	desc           string
}

// uidBase returns the host uid range start used when running as root.
func uidBase() (int, error) {
	v := os.Getenv("AIRLOCK_UID_BASE")
	if v == "" {
		return DefaultUIDBase, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 65536 || n > 1<<31 {
		return 0, fmt.Errorf("AIRLOCK_UID_BASE=%q: want an integer in [65536, 2^31]", v)
	}
	return n, nil
}

// mapping decides the uid/gid maps for a sandbox user (uid, gid inside).
// As root, sandbox ids 0-65535 map to an unprivileged range; otherwise the
// caller's own uid and gid become the sandbox user (unprivileged user
// namespaces). Host root is never mapped.
func mapping(uid, gid int) (idMap, error) {
	if os.Geteuid() == 0 {
		base, err := uidBase()
		if err != nil {
			return idMap{}, err
		}
		return idMap{
			uidMap:    fmt.Sprintf("0 %d 65536\n", base),
			gidMap:    fmt.Sprintf("0 %d 65536\n", base),
			setgroups: true,
			hostUID:   base + uid,
			hostGID:   base + gid,
			desc:      fmt.Sprintf("sandbox 0-65535 -> host %d-%d", base, base+65535),
		}, nil
	}
	u, g := os.Geteuid(), os.Getegid()
	return idMap{
		uidMap:  fmt.Sprintf("%d %d 1\n", uid, u),
		gidMap:  fmt.Sprintf("%d %d 1\n", gid, g),
		hostUID: u,
		hostGID: g,
		desc:    fmt.Sprintf("sandbox %d -> host %d (unprivileged)", uid, u),
	}, nil
}

// write installs the maps for the child pid.
func (m idMap) write(pid int) error {
	dir := "/proc/" + strconv.Itoa(pid)
	if !m.setgroups {
		if err := os.WriteFile(dir+"/setgroups", []byte("deny"), 0); err != nil {
			return fmt.Errorf("write setgroups: %w", err)
		}
	}
	if err := os.WriteFile(dir+"/gid_map", []byte(m.gidMap), 0); err != nil {
		return fmt.Errorf("write gid_map: %w", err)
	}
	if err := os.WriteFile(dir+"/uid_map", []byte(m.uidMap), 0); err != nil {
		return fmt.Errorf("write uid_map: %w", err)
	}
	return nil
}
