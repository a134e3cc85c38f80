package imagestore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Temp is a directory under the store's tmp/ that one operation (a blob
// download, a layer unpack, an import, a commit, a template build's
// context) owns while it runs. It is leased: an exclusive flock on the
// directory, held until Close, tells a sweep (Open, in this or another
// process sharing the store) that its owner is alive. A process killed
// with SIGKILL loses its flocks with its descriptors, so the next Open
// removes what it left and nothing else.
type Temp struct {
	// Path is the directory, empty at first.
	Path string
	f    *os.File
}

// TempDir makes a leased temporary directory in the store's tmp/, named
// prefix and a random suffix. Close removes it.
func (s *Store) TempDir(prefix string) (*Temp, error) {
	base := filepath.Join(s.dir, "tmp")
	for range 8 {
		p, err := os.MkdirTemp(base, prefix)
		if err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // swept before we held it
		}
		if err != nil {
			os.Remove(p)
			return nil, fmt.Errorf("image store: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			os.Remove(p)
			return nil, fmt.Errorf("image store: lease %s: %w", p, err)
		}
		// A sweep that took the flock between MkdirTemp and ours removed
		// the directory: then p is gone (or, never, another directory).
		if sameFile(f, p) {
			return &Temp{Path: p, f: f}, nil
		}
		f.Close()
	}
	return nil, errors.New("image store: temporary directory swept away repeatedly")
}

// sameFile reports whether path p is still the directory open as f.
func sameFile(f *os.File, p string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) != nil || unix.Lstat(p, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// Close removes the directory (what was renamed out of it stays) and then
// drops the lease. Idempotent.
func (t *Temp) Close() error {
	if t == nil || t.f == nil {
		return nil
	}
	err := removeAll(t.Path)
	t.f.Close()
	t.f = nil
	if err != nil {
		return fmt.Errorf("image store: remove %s: %w", t.Path, err)
	}
	return nil
}

// sweep removes what operations that are no longer running left in the
// store: every entry of tmp/ whose lease nobody holds (a half-downloaded
// blob, a half-unpacked layer of a process killed mid pull), and, when no
// writer holds the store's lock, the temporary files of atomic writes in
// oci/ and leases/ and the leases whose holder is gone. Entries whose owner is alive, in this process or
// another one sharing the store, are left alone. It reports what it
// removed.
func (s *Store) sweep() ([]string, error) {
	var removed []string
	base := filepath.Join(s.dir, "tmp")
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, fmt.Errorf("image store: sweep: %w", err)
	}
	for _, e := range ents {
		p := filepath.Join(base, e.Name())
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err == nil {
			if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
				unix.Close(fd) // leased: its operation runs
				continue
			}
		} else if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENXIO) {
			return removed, fmt.Errorf("image store: sweep %s: %w", p, err)
		}
		rerr := removeAll(p)
		if fd >= 0 {
			unix.Close(fd)
		}
		if rerr != nil {
			return removed, fmt.Errorf("image store: sweep %s: %w", p, rerr)
		}
		removed = append(removed, p)
	}
	// The atomic writes (index.json, leases) run under the store's lock.
	unlock, ok, err := s.tryLock()
	if err != nil || !ok {
		return removed, err
	}
	defer unlock()
	s.leased() // drops the leases of sandboxes and builds that are gone
	for _, d := range []string{filepath.Join(s.dir, "oci"), filepath.Join(s.dir, "leases")} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".tmp-") {
				p := filepath.Join(d, e.Name())
				if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
					return removed, fmt.Errorf("image store: sweep: %w", err)
				}
				removed = append(removed, p)
			}
		}
	}
	return removed, nil
}

// tryLock is lock without waiting: ok is false when another writer holds
// the store.
func (s *Store) tryLock() (unlock func(), ok bool, err error) {
	if !s.mu.TryLock() {
		return nil, false, nil
	}
	f, err := os.OpenFile(filepath.Join(s.dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		s.mu.Unlock()
		return nil, false, fmt.Errorf("image store lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		s.mu.Unlock()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("image store lock: %w", err)
	}
	return func() { f.Close(); s.mu.Unlock() }, true, nil
}
