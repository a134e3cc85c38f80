// Package idrange hands out host uid/gid ranges to sandboxes, one range of
// Size ids per live sandbox, host-wide: every airlock process on the host
// (servers with any state dir, one-shot runs) leases from the same
// directory, so no two live sandboxes ever share host ids and therefore
// never share the kernel's per-user limits (inotify instances, pipe
// buffers, message queues, user namespaces, RLIMIT_NPROC).
//
// A lease is a file named after the range's first host id, holding the
// pid and start time of the process whose life bounds it (a sandbox's
// init, or the launcher until the init exists), or, for a sandbox whose
// host processes do not span its life (a gVisor sandbox's checkpoint ends
// them, its restore starts others), a directory that does (its state
// directory), by path and inode number: a path that names its sandbox, so
// that it is never made again for another. A lease whose holder is gone is free: a crash
// never leaks a range. Allocation runs under an
// flock of the directory's lock file; the directory lives on /run, which
// a reboot empties along with every sandbox.
package idrange

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Size is the number of uids (and gids) in one range: sandbox ids 0-65535.
const Size = 65536

// DefaultFirst is the first host id of the first range. It sits far above
// the ids that useradd and /etc/subuid hand out.
const DefaultFirst = 1_500_000_000

// maxID is the last host id a range may use (ids up to 2^32-2 are valid;
// stay below 2^31 so that ids remain positive in every API that uses int32).
const maxID = 1<<31 - 1

// DefaultDir is where leases live.
const DefaultDir = "/run/airlock/idranges"

// ErrInUse is returned (wrapped) when a requested range is leased by a live
// process.
var ErrInUse = errors.New("host id range in use by another live sandbox")

// Pool allocates ranges first, first+Size, ... up to maxID, with leases in
// Dir.
type Pool struct {
	Dir   string
	First int
}

// Default returns the host-wide pool: DefaultDir, and the first id from
// AIRLOCK_UID_BASE (default DefaultFirst).
func Default() (Pool, error) {
	first := DefaultFirst
	if v := os.Getenv("AIRLOCK_UID_BASE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < Size || n > maxID-Size+1 {
			return Pool{}, fmt.Errorf("AIRLOCK_UID_BASE=%q: want an integer in [%d, %d]", v, Size, maxID-Size+1)
		}
		first = n
	}
	return Pool{Dir: DefaultDir, First: first}, nil
}

// Lease is one leased range: host ids Base .. Base+Size-1.
type Lease struct {
	Base int
	pool Pool
	h    holder
}

func (l *Lease) path() string { return filepath.Join(l.pool.Dir, strconv.Itoa(l.Base)) }

// holder identifies a process: pid and start time (clock ticks since
// boot, /proc/PID/stat field 22), which together survive pid reuse; or a
// directory: its path, unique to its holder, and inode number.
type holder struct {
	pid   int
	start uint64
	dir   string
	ino   uint64
}

// dirHolder identifies directory dir, which must exist.
func dirHolder(dir string) (holder, error) {
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, " \n") {
		return holder{}, fmt.Errorf("directory %q: not an absolute path without spaces", dir)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return holder{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return holder{}, fmt.Errorf("%s is not a directory", dir)
	}
	return holder{dir: dir, ino: st.Ino}, nil
}

// parseHolder reads a lease file's content.
func parseHolder(b []byte) (holder, bool) {
	var h holder
	if rest, ok := strings.CutPrefix(string(b), "dir "); ok {
		_, err := fmt.Sscan(rest, &h.ino, &h.dir)
		return h, err == nil && h.dir != ""
	}
	_, err := fmt.Sscan(string(b), &h.pid, &h.start)
	return h, err == nil
}

func holderOf(pid int) (holder, error) {
	st, err := StartTime(pid)
	if err != nil {
		return holder{}, err
	}
	return holder{pid: pid, start: st}, nil
}

func (h holder) String() string {
	if h.dir != "" {
		return fmt.Sprintf("dir %d %s\n", h.ino, h.dir)
	}
	return fmt.Sprintf("%d %d\n", h.pid, h.start)
}

// alive: the holder runs. A zombie (exited, not yet reaped: a holder
// whose parent died is left to PID 1, which may reap it late) holds no
// ids any more.
func (h holder) alive() bool {
	if h.dir != "" {
		var st unix.Stat_t
		return unix.Stat(h.dir, &st) == nil && st.Ino == h.ino
	}
	st, state, err := procStat(h.pid)
	return err == nil && st == h.start && state != "Z" && state != "X"
}

// StartTime returns field 22 of /proc/PID/stat.
func StartTime(pid int) (uint64, error) {
	st, _, err := procStat(pid)
	return st, err
}

// procStat returns fields 22 (start time) and 3 (state) of /proc/PID/stat.
func procStat(pid int) (uint64, string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", err
	}
	i := bytes.LastIndexByte(b, ')') // the command name may contain ") "
	if i < 0 {
		return 0, "", errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, "", errors.New("short /proc stat")
	}
	st, err := strconv.ParseUint(f[19], 10, 64)
	return st, f[0], err
}

// lock opens (creating) the pool's directory and takes its exclusive lock.
func (p Pool) lock() (unlock func(), err error) {
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("id ranges: create %s: %w", p.Dir, err)
	}
	fi, err := os.Lstat(p.Dir)
	if err != nil {
		return nil, fmt.Errorf("id ranges: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !fi.IsDir() || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("id ranges: %s is not a private directory owned by uid %d", p.Dir, os.Geteuid())
	}
	fd, err := unix.Open(filepath.Join(p.Dir, ".lock"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("id ranges: open lock: %w", err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("id ranges: lock: %w", err)
	}
	return func() { unix.Close(fd) }, nil
}

// leases lists the bases of the lease files present.
func (p Pool) leases() ([]int, error) {
	ents, err := os.ReadDir(p.Dir)
	if err != nil {
		return nil, fmt.Errorf("id ranges: list: %w", err)
	}
	var out []int
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// liveHolder reads a lease and reports its holder if that process lives.
// A lease of a dead holder (or an unreadable one) is removed.
func (p Pool) liveHolder(base int) (holder, bool) {
	path := filepath.Join(p.Dir, strconv.Itoa(base))
	b, err := os.ReadFile(path)
	if err == nil {
		if h, ok := parseHolder(b); ok && h.alive() {
			return h, true
		}
	}
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		os.Remove(path)
	}
	return holder{}, false
}

func overlaps(a, b int) bool { return a < b+Size && b < a+Size }

// begin identifies holder pid, takes the pool's lock and lists the leases.
func (p Pool) begin(pid int) (h holder, existing []int, unlock func(), err error) {
	if h, err = holderOf(pid); err != nil {
		return h, nil, nil, fmt.Errorf("id ranges: holder %d: %w", pid, err)
	}
	return p.beginAs(h)
}

// beginAs takes the pool's lock for holder h and lists the leases.
func (p Pool) beginAs(h holder) (_ holder, existing []int, unlock func(), err error) {
	if unlock, err = p.lock(); err != nil {
		return h, nil, nil, err
	}
	if existing, err = p.leases(); err != nil {
		unlock()
		return h, nil, nil, err
	}
	return h, existing, unlock, nil
}

// Acquire leases a free range for holder pid (the calling process, or the
// sandbox init once it exists: see SetHolder). prefer, if non-zero, is the
// base wanted (a workspace that belongs to it): Acquire leases exactly that
// range or fails with ErrInUse. skip reports bases the caller knows to be
// taken (its store's live sandboxes) and may be nil.
func (p Pool) Acquire(pid, prefer int, skip func(base int) bool) (*Lease, error) {
	h, existing, unlock, err := p.begin(pid)
	if err != nil {
		return nil, err
	}
	defer unlock()
	free := func(base int) bool {
		if skip != nil && skip(base) {
			return false
		}
		for _, e := range existing {
			if overlaps(e, base) {
				if _, live := p.liveHolder(e); live {
					return false
				}
			}
		}
		return true
	}
	take := func(base int) (*Lease, error) {
		l := &Lease{Base: base, pool: p, h: h}
		if err := writeHolder(l.path(), h); err != nil {
			return nil, err
		}
		return l, nil
	}
	if prefer != 0 {
		if !free(prefer) {
			return nil, fmt.Errorf("host ids %d-%d: %w", prefer, prefer+Size-1, ErrInUse)
		}
		return take(prefer)
	}
	// Leases are released when their sandbox ends; only a crash leaves one
	// behind. So take the lowest range no lease file overlaps, reading no
	// lease, after checking a few leases at random and removing those whose
	// holder is dead (crash leftovers are reclaimed over time, and cost
	// every allocation a bounded number of reads).
	for i := 0; i < reclaimPerAcquire && len(existing) > 0; i++ {
		e := existing[rand.IntN(len(existing))]
		if skip == nil || !skip(e) {
			p.liveHolder(e)
		}
	}
	if existing, err = p.leases(); err != nil {
		return nil, err
	}
	slices.Sort(existing)
	for base := p.First; base <= maxID-Size+1; base += Size {
		if skip != nil && skip(base) {
			continue
		}
		// existing is sorted: only leases starting before base+Size can overlap.
		i, _ := slices.BinarySearch(existing, base-Size+1)
		if i < len(existing) && existing[i] < base+Size {
			continue
		}
		return take(base)
	}
	// Every range has a lease file: look for dead holders among them.
	for base := p.First; base <= maxID-Size+1; base += Size {
		if free(base) {
			return take(base)
		}
	}
	return nil, fmt.Errorf("id ranges: all %d ranges from %d are in use", (maxID-p.First+1)/Size, p.First)
}

// Reap removes every lease whose holder has died (what processes killed
// with SIGKILL left; Acquire otherwise reclaims them a few at a time) and
// returns how many it removed. A server calls it on start, once it has
// killed what remained of its lost sandboxes.
func (p Pool) Reap() (int, error) {
	unlock, err := p.lock()
	if err != nil {
		return 0, err
	}
	defer unlock()
	existing, err := p.leases()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range existing {
		if _, live := p.liveHolder(e); !live {
			n++
		}
	}
	return n, nil
}

// reclaimPerAcquire is how many leases an allocation checks for a dead
// holder.
const reclaimPerAcquire = 4

// Claim re-takes the lease of a range recorded for a running sandbox whose
// init is pid (after a server restart). It fails with ErrInUse if another
// live process holds an overlapping range.
func (p Pool) Claim(base, pid int) (*Lease, error) {
	h, err := holderOf(pid)
	if err != nil {
		return nil, fmt.Errorf("id ranges: holder %d: %w", pid, err)
	}
	return p.claim(base, h)
}

// ClaimDir is Claim for a sandbox whose lease directory dir holds (see
// Lease.SetHolderDir).
func (p Pool) ClaimDir(base int, dir string) (*Lease, error) {
	h, err := dirHolder(dir)
	if err != nil {
		return nil, fmt.Errorf("id ranges: holder: %w", err)
	}
	return p.claim(base, h)
}

func (p Pool) claim(base int, h holder) (*Lease, error) {
	h, existing, unlock, err := p.beginAs(h)
	if err != nil {
		return nil, err
	}
	defer unlock()
	for _, e := range existing {
		if overlaps(e, base) {
			if other, live := p.liveHolder(e); live && other != h {
				return nil, fmt.Errorf("host ids %d-%d (held by %s): %w", e, e+Size-1, other.name(), ErrInUse)
			}
		}
	}
	l := &Lease{Base: base, pool: p, h: h}
	if err := putHolder(l.path(), h); err != nil {
		return nil, err
	}
	return l, nil
}

// Free removes the lease of the range at base if its holder has died (a
// sandbox's init, once the sandbox has ended); a live holder's lease is
// left alone, so a caller that only knows the base cannot free a range
// someone else has taken since.
func (p Pool) Free(base int) error {
	unlock, err := p.lock()
	if err != nil {
		return err
	}
	defer unlock()
	p.liveHolder(base)
	return nil
}

// putHolder makes the lease file at path name h: in place if it exists
// (rewriteHolder), else as a new file (writeHolder).
func putHolder(path string, h holder) error {
	err := rewriteHolder(path, h)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, errTooLong) {
		return writeHolder(path, h)
	}
	return err
}

// maxInPlace is the longest lease text rewriteHolder writes in place: far
// below a page, so that the one write never spans two.
const maxInPlace = 512

var errTooLong = errors.New("lease text too long to rewrite in place")

// rewriteHolder writes h over the existing lease file at path in place:
// one write at offset 0 of h's text, padded with spaces to the file's
// length (parseHolder reads fields, so a padding is ignored). A write of
// less than a page to a regular file is done whole or not at all even if
// this process is killed during it, and every reader holds the pool's
// lock, so no one ever reads half of it. Unlike writeHolder it never
// renames over an existing file, which on ext4 (where /run is a directory
// of the root disk on some hosts) starts a flush of the new file's data to
// disk first (auto_da_alloc): about 1.7 ms of every SetHolder on such a
// host.
func rewriteHolder(path string, h holder) error {
	text := []byte(h.String())
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("id ranges: rewrite lease: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("id ranges: rewrite lease: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("id ranges: rewrite lease: %s is not a regular file", path)
	}
	if n := int(st.Size); n > len(text) {
		text = append(text, bytes.Repeat([]byte{' '}, n-len(text))...)
	}
	if len(text) > maxInPlace {
		return errTooLong
	}
	n, err := unix.Pwrite(fd, text, 0)
	if err == nil && n != len(text) {
		err = fmt.Errorf("short write (%d of %d bytes)", n, len(text))
	}
	if err != nil {
		return fmt.Errorf("id ranges: rewrite lease: %w", err)
	}
	return nil
}

// writeHolder replaces a lease file atomically.
func writeHolder(path string, h holder) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(h.String()), 0o600); err != nil {
		return fmt.Errorf("id ranges: write lease: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("id ranges: write lease: %w", err)
	}
	return nil
}

// SetHolder hands the lease to another process (the sandbox's init, whose
// life then bounds the lease even if this process dies).
func (l *Lease) SetHolder(pid int) error {
	h, err := holderOf(pid)
	if err != nil {
		return fmt.Errorf("id ranges: holder %d: %w", pid, err)
	}
	return l.setHolder(h)
}

// SetHolderDir hands the lease to directory dir (a sandbox's state
// directory, whose path names it and is never made again for another):
// the range stays taken while dir, this very directory, exists, whatever
// becomes of any process. For a sandbox whose host processes come and go
// while it lives (a gVisor checkpoint ends them; a restore starts others).
func (l *Lease) SetHolderDir(dir string) error {
	h, err := dirHolder(dir)
	if err != nil {
		return fmt.Errorf("id ranges: holder: %w", err)
	}
	return l.setHolder(h)
}

func (l *Lease) setHolder(h holder) error {
	unlock, err := l.pool.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if !l.ours() {
		return fmt.Errorf("id ranges: lease %d was lost", l.Base)
	}
	if err := putHolder(l.path(), h); err != nil {
		return err
	}
	l.h = h
	return nil
}

// name says who h is, for errors.
func (h holder) name() string {
	if h.dir != "" {
		return h.dir
	}
	return "pid " + strconv.Itoa(h.pid)
}

// ours reports whether the lease file still names this lease's holder
// (a padding left by rewriteHolder aside).
func (l *Lease) ours() bool {
	b, err := os.ReadFile(l.path())
	return err == nil && string(bytes.TrimRight(b, " ")) == l.h.String()
}

// Release frees the range now (its holder's death would free it anyway).
// Call it only once no process of the sandbox remains. A lease that another
// process has meanwhile taken over (ours had a dead holder) is left alone.
func (l *Lease) Release() {
	if l == nil {
		return
	}
	unlock, err := l.pool.lock()
	if err != nil {
		return
	}
	defer unlock()
	if l.ours() {
		os.Remove(l.path())
	}
}
