package connlimit

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Cap returns how many connections a server may hold open: want, but at
// most half of the process's descriptor limit (RLIMIT_NOFILE; the Go
// runtime raises its soft limit to the hard one at start), so that the
// other half stays for what sandboxes need (sockets, pidfds, cgroup and
// overlay descriptors) however many clients connect. It returns the
// limit it found too.
func Cap(want int) (capped int, limit uint64, err error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, fmt.Errorf("read the descriptor limit: %w", err)
	}
	capped = want
	if half := rl.Cur / 2; uint64(capped) > half {
		capped = int(half)
	}
	if capped < MinConns {
		return 0, rl.Cur, fmt.Errorf("descriptor limit %d leaves room for only %d connections (at least %d needed; raise ulimit -n)", rl.Cur, capped, MinConns)
	}
	return capped, rl.Cur, nil
}

// MinConns is the fewest connections Cap accepts to give a server.
const MinConns = 16
