package store

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrNoSpace means a write failed because the state directory's file
// system is full. Errors wrapping it name the directory.
var ErrNoSpace = errors.New("no space left on device")

// lowSpace is the free space below which a failed write is blamed on a
// full disk: SQLite reports a full disk as SQLITE_FULL or, when its
// shared-memory index cannot grow, as a bare "disk I/O error".
const lowSpace = 1 << 20

// spaceErr returns err, unless err is a failed write on a (nearly) full
// state directory: then an error wrapping ErrNoSpace that names it.
func (s *Store) spaceErr(err error) error { return noSpace(filepath.Dir(s.path), err) }

// sharedErr is spaceErr for a write to the shared tables: a PostgreSQL
// error says nothing about the local disk.
func (s *Store) sharedErr(err error) error {
	if s.pg {
		return fmt.Errorf("PostgreSQL %s: %w", s.pgDesc, err)
	}
	return s.spaceErr(err)
}

func noSpace(dir string, err error) error {
	if err == nil || errors.Is(err, ErrNoSpace) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrEnded) || errors.Is(err, ErrClosed) {
		return err
	}
	var st unix.Statfs_t
	if errors.Is(err, unix.ENOSPC) || (unix.Statfs(dir, &st) == nil && int64(st.Bavail)*int64(st.Bsize) < lowSpace) {
		return fmt.Errorf("%w: %s (%v)", ErrNoSpace, dir, err)
	}
	return err
}
