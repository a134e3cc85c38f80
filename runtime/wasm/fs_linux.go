package wasm

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/sys"
)

// rootFS serves one preopened directory to the guest through an os.Root:
// every path is resolved by the host beneath the directory, symlinks
// included, so a guest cannot reach outside it whatever wazero's own
// checks do. A read-only rootFS refuses every change with EROFS before
// touching the host, and opens files read-only.
type rootFS struct {
	experimentalsys.UnimplementedFS
	root     *os.Root
	readOnly bool
	q        *quota // nil: no quota (read-only)
}

func newRootFS(dir string, readOnly bool) (*rootFS, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &rootFS{root: r, readOnly: readOnly}, nil
}

func (r *rootFS) String() string { return r.root.Name() }

func (r *rootFS) close() { _ = r.root.Close() }

// errno turns a host error into a WASI errno. os.Root's own refusals
// ("path escapes from parent") carry no errno: they become EPERM.
func errno(err error) experimentalsys.Errno {
	if err == nil {
		return 0
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return experimentalsys.UnwrapOSError(err)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return experimentalsys.ENOENT
	}
	if errors.Is(err, fs.ErrExist) {
		return experimentalsys.EEXIST
	}
	return experimentalsys.EPERM
}

// name maps wazero's relative path ("", "." or "/" for the directory
// itself) to an os.Root name.
func name(p string) string {
	switch p {
	case "", "/":
		return "."
	}
	return p
}

const writeFlags = experimentalsys.O_WRONLY | experimentalsys.O_RDWR | experimentalsys.O_CREAT |
	experimentalsys.O_TRUNC | experimentalsys.O_APPEND | experimentalsys.O_EXCL

// OpenFile implements sys.FS.
func (r *rootFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	if r.readOnly && flag&writeFlags != 0 {
		return nil, experimentalsys.EROFS
	}
	oflag := unix.O_CLOEXEC
	switch {
	case flag&experimentalsys.O_RDWR != 0:
		oflag |= unix.O_RDWR
	case flag&experimentalsys.O_WRONLY != 0:
		oflag |= unix.O_WRONLY
	}
	for _, m := range [...]struct {
		w experimentalsys.Oflag
		u int
	}{
		{experimentalsys.O_APPEND, unix.O_APPEND}, {experimentalsys.O_CREAT, unix.O_CREAT},
		{experimentalsys.O_EXCL, unix.O_EXCL}, {experimentalsys.O_TRUNC, unix.O_TRUNC},
		{experimentalsys.O_DIRECTORY, unix.O_DIRECTORY}, {experimentalsys.O_NOFOLLOW, unix.O_NOFOLLOW},
		{experimentalsys.O_NONBLOCK, unix.O_NONBLOCK}, {experimentalsys.O_SYNC, unix.O_SYNC},
		{experimentalsys.O_DSYNC, unix.O_DSYNC},
	} {
		if flag&m.w != 0 {
			oflag |= m.u
		}
	}
	if flag&experimentalsys.O_DIRECTORY != 0 && oflag&(unix.O_WRONLY|unix.O_RDWR) != 0 {
		return nil, experimentalsys.EISDIR
	}
	created := false
	if oflag&unix.O_CREAT != 0 && r.q != nil {
		if _, err := r.root.Lstat(name(p)); errors.Is(err, fs.ErrNotExist) {
			if !r.q.inode(1) {
				return nil, experimentalsys.EIO
			}
			created = true
		}
	}
	var freed int64
	if oflag&unix.O_TRUNC != 0 && r.q != nil {
		if fi, err := r.root.Stat(name(p)); err == nil && fi.Mode().IsRegular() {
			freed = fi.Size()
		}
	}
	f, err := r.root.OpenFile(name(p), oflag, perm&fs.ModePerm)
	if err != nil {
		if created {
			r.q.inode(-1)
		}
		return nil, errno(err)
	}
	r.q.release(freed)
	return &rootFile{fileSeeker: fileSeeker[int64]{f: f}, f: f, readOnly: r.readOnly, append: oflag&unix.O_APPEND != 0, q: r.q}, 0
}

func stat(fi fs.FileInfo, err error) (sys.Stat_t, experimentalsys.Errno) {
	if err != nil {
		return sys.Stat_t{}, errno(err)
	}
	return sys.NewStat_t(fi), 0
}

// Lstat implements sys.FS.
func (r *rootFS) Lstat(p string) (sys.Stat_t, experimentalsys.Errno) {
	return stat(r.root.Lstat(name(p)))
}

// Stat implements sys.FS.
func (r *rootFS) Stat(p string) (sys.Stat_t, experimentalsys.Errno) {
	return stat(r.root.Stat(name(p)))
}

// Mkdir implements sys.FS.
func (r *rootFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	if !r.q.inode(1) {
		return experimentalsys.EIO
	}
	e := errno(r.root.Mkdir(name(p), perm&fs.ModePerm))
	if e == experimentalsys.ENOTDIR {
		e = experimentalsys.ENOENT
	}
	if e != 0 {
		r.q.inode(-1)
	}
	return e
}

// Chmod implements sys.FS.
func (r *rootFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return errno(r.root.Chmod(name(p), perm&fs.ModePerm))
}

// Rename implements sys.FS.
func (r *rootFS) Rename(from, to string) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return errno(r.root.Rename(name(from), name(to)))
}

// Rmdir implements sys.FS.
func (r *rootFS) Rmdir(p string) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	fi, err := r.root.Lstat(name(p))
	if err != nil {
		return errno(err)
	}
	if !fi.IsDir() {
		return experimentalsys.ENOTDIR
	}
	e := errno(r.root.Remove(name(p)))
	if e == 0 {
		r.q.inode(-1)
	}
	return e
}

// Unlink implements sys.FS.
func (r *rootFS) Unlink(p string) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	fi, err := r.root.Lstat(name(p))
	if err != nil {
		return errno(err)
	}
	if fi.IsDir() {
		return experimentalsys.EISDIR
	}
	e := errno(r.root.Remove(name(p)))
	if e == 0 && lastLink(fi) {
		r.q.release(fi.Size())
		r.q.inode(-1)
	}
	return e
}

// Link implements sys.FS: both names are resolved beneath this directory.
func (r *rootFS) Link(oldName, newName string) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return errno(r.root.Link(name(oldName), name(newName)))
}

// Symlink implements sys.FS by refusing: a link the guest leaves behind
// would be followed by host tools that read the workspace later.
func (r *rootFS) Symlink(string, string) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return experimentalsys.EPERM
}

// Readlink implements sys.FS.
func (r *rootFS) Readlink(p string) (string, experimentalsys.Errno) {
	s, err := r.root.Readlink(name(p))
	return s, errno(err)
}

// Utimens implements sys.FS.
func (r *rootFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	if r.readOnly {
		return experimentalsys.EROFS
	}
	return errno(r.root.Chtimes(name(p), nanoTime(atim), nanoTime(mtim)))
}

// nanoTime converts a WASI timestamp; UTIME_OMIT becomes the zero time,
// which os.Chtimes leaves unchanged.
func nanoTime(ns int64) time.Time {
	if ns == experimentalsys.UTIME_OMIT {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// rootFile is a host file opened beneath a rootFS.
type rootFile struct {
	fileSeeker[int64]
	f        *os.File
	readOnly bool
	append   bool
	st       *sys.Stat_t
	q        *quota
}

func (f *rootFile) cachedStat() (sys.Stat_t, experimentalsys.Errno) {
	if f.st == nil {
		st, e := f.Stat()
		if e != 0 {
			return st, e
		}
		f.st = &st
	}
	return *f.st, 0
}

// Dev implements sys.File.
func (f *rootFile) Dev() (uint64, experimentalsys.Errno) {
	st, e := f.cachedStat()
	return st.Dev, e
}

// Ino implements sys.File.
func (f *rootFile) Ino() (sys.Inode, experimentalsys.Errno) {
	st, e := f.cachedStat()
	return st.Ino, e
}

// IsDir implements sys.File.
func (f *rootFile) IsDir() (bool, experimentalsys.Errno) {
	st, e := f.cachedStat()
	return st.Mode.IsDir(), e
}

// IsAppend implements sys.File.
func (f *rootFile) IsAppend() bool { return f.append }

// SetAppend implements sys.File with fcntl (no reopening by path).
func (f *rootFile) SetAppend(enable bool) experimentalsys.Errno {
	fd := int(f.f.Fd())
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return errno(err)
	}
	if enable {
		fl |= unix.O_APPEND
	} else {
		fl &^= unix.O_APPEND
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl); err != nil {
		return errno(err)
	}
	f.append = enable
	return 0
}

// Stat implements sys.File.
func (f *rootFile) Stat() (sys.Stat_t, experimentalsys.Errno) { return stat(f.f.Stat()) }

// Read implements sys.File.
func (f *rootFile) Read(b []byte) (int, experimentalsys.Errno) {
	n, err := f.f.Read(b)
	if err == io.EOF {
		err = nil
	}
	return n, errno(err)
}

// Pread implements sys.File.
func (f *rootFile) Pread(b []byte, off int64) (int, experimentalsys.Errno) {
	n, err := f.f.ReadAt(b, off)
	if err == io.EOF {
		err = nil
	}
	return n, errno(err)
}

// fileSeeker gives rootFile wazero's sys.File Seek, and the methods rootFile
// does not implement (UnimplementedFile: ENOSYS). It is generic over the
// offset type only because go vet's stdmethods check takes any method
// declared as Seek(int64, int) for a broken io.Seeker (wanting an error
// result, where wazero's interface wants an Errno); instantiated with int64
// the signature is exactly the interface's.
type fileSeeker[O ~int64] struct {
	experimentalsys.UnimplementedFile
	f *os.File
}

// Seek implements sys.File.
func (s fileSeeker[O]) Seek(off O, whence int) (int64, experimentalsys.Errno) {
	n, err := s.f.Seek(int64(off), whence)
	return n, errno(err)
}

// Readdir implements sys.File.
func (f *rootFile) Readdir(n int) ([]experimentalsys.Dirent, experimentalsys.Errno) {
	ents, err := f.f.ReadDir(n)
	if err == io.EOF {
		err = nil
	}
	out := make([]experimentalsys.Dirent, 0, len(ents))
	for _, e := range ents {
		out = append(out, experimentalsys.Dirent{Name: e.Name(), Type: e.Type()})
	}
	return out, errno(err)
}

// Write implements sys.File.
func (f *rootFile) Write(b []byte) (int, experimentalsys.Errno) {
	if e := f.checkWrite(b, -1); e != 0 {
		return 0, e
	}
	n, err := f.f.Write(b)
	return n, errno(err)
}

// Pwrite implements sys.File.
func (f *rootFile) Pwrite(b []byte, off int64) (int, experimentalsys.Errno) {
	if e := f.checkWrite(b, off); e != 0 {
		return 0, e
	}
	n, err := f.f.WriteAt(b, off)
	return n, errno(err)
}

// Truncate implements sys.File.
func (f *rootFile) Truncate(size int64) experimentalsys.Errno {
	if f.readOnly {
		return experimentalsys.EROFS
	}
	if f.q != nil {
		n, _, e := growth(f.f, size, 0)
		if e != 0 {
			return e
		}
		if n == 0 { // shrinking: credit what goes
			if fi, err := f.f.Stat(); err == nil {
				f.q.release(fi.Size() - size)
			}
		} else if !f.q.grow(n, size) {
			return experimentalsys.EIO
		}
	}
	return errno(f.f.Truncate(size))
}

// Sync implements sys.File.
func (f *rootFile) Sync() experimentalsys.Errno { return errno(f.f.Sync()) }

// Datasync implements sys.File.
func (f *rootFile) Datasync() experimentalsys.Errno { return errno(unix.Fdatasync(int(f.f.Fd()))) }

// Utimens implements sys.File with futimens on the open descriptor.
func (f *rootFile) Utimens(atim, mtim int64) experimentalsys.Errno {
	if f.readOnly {
		return experimentalsys.EROFS
	}
	ts := [2]unix.Timespec{utimespec(atim), utimespec(mtim)}
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, f.f.Fd(), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return errno(e)
	}
	return 0
}

func utimespec(ns int64) unix.Timespec {
	if ns == experimentalsys.UTIME_OMIT {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.NsecToTimespec(ns)
}

// Close implements sys.File.
func (f *rootFile) Close() experimentalsys.Errno { return errno(f.f.Close()) }
