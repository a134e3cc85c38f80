package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// maxListDepth bounds List's depth.
const maxListDepth = 64

// invalid wraps a request decoding error.
func invalid(err error) *Error {
	return &Error{Code: CodeInvalidArgument, Message: err.Error()}
}

// toError turns any error into a new *Error, classifying errno values.
func toError(err error) *Error {
	if err == nil {
		return &Error{Code: CodeInternal, Message: "unknown error"}
	}
	var e *Error
	if errors.As(err, &e) {
		c := *e
		return &c
	}
	code := CodeIO
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ENOENT, syscall.ESRCH:
			code = CodeNotFound
		case syscall.EEXIST, syscall.ENOTEMPTY:
			code = CodeExists
		case syscall.ENOTDIR:
			code = CodeNotADirectory
		case syscall.EISDIR:
			code = CodeIsADirectory
		case syscall.EACCES, syscall.EPERM, syscall.EROFS:
			code = CodePermissionDenied
		case syscall.EINVAL, syscall.ENOEXEC, syscall.ELOOP, syscall.EBUSY:
			code = CodeInvalidArgument
		case syscall.ENAMETOOLONG:
			code = CodeNameTooLong
		case syscall.EFBIG, syscall.E2BIG:
			code = CodeTooLarge
		case syscall.ENOSPC, syscall.EDQUOT:
			code = CodeNoSpace
		case syscall.EXDEV:
			code = CodeCrossDevice
		case syscall.ENXIO:
			code = CodeNotRegular
		case syscall.EPIPE:
			code = CodeClosed
		case syscall.EAGAIN:
			code = CodeLimit
		}
	}
	return &Error{Code: code, Message: err.Error()}
}

// resolve makes a request path absolute against the home directory. An
// empty path is the home itself when allowEmpty, an error otherwise.
func (a *hostConn) resolve(p string, allowEmpty bool) (string, error) {
	if p == "" {
		if allowEmpty {
			return a.home, nil
		}
		return "", &Error{Code: CodeInvalidArgument, Message: "empty path"}
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", &Error{Code: CodeInvalidArgument, Message: "path contains a NUL byte"}
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(a.home, p)
	}
	return filepath.Clean(p), nil
}

func (a *hostConn) pathRequest(payload []byte) (string, error) {
	var req pathMsg
	if err := decodeJSON(payload, &req); err != nil {
		return "", invalid(err)
	}
	return a.resolve(req.Path, false)
}

// notRegular explains why a path is refused for reading or writing.
func notRegular(path string, mode uint32) error {
	what := "not a regular file"
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return &Error{Code: CodeIsADirectory, Message: path + " is a directory"}
	case syscall.S_IFIFO:
		what = "a FIFO, not a regular file"
	case syscall.S_IFCHR:
		what = "a character device, not a regular file"
	case syscall.S_IFBLK:
		what = "a block device, not a regular file"
	case syscall.S_IFSOCK:
		what = "a socket, not a regular file"
	}
	return &Error{Code: CodeNotRegular, Message: path + " is " + what}
}

// openRegular opens path without blocking (a FIFO never blocks the open) and
// refuses anything but a regular file, checking both before and after the
// open. The returned file is in blocking mode.
func openRegular(path string, flags int, perm uint32) (*os.File, bool, error) {
	var st syscall.Stat_t
	created := false
	if err := syscall.Stat(path, &st); err == nil {
		if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			return nil, false, notRegular(path, st.Mode)
		}
	} else if errors.Is(err, syscall.ENOENT) && flags&syscall.O_CREAT != 0 {
		created = true
	} else {
		return nil, false, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	fd, err := syscall.Open(path, flags|syscall.O_NONBLOCK|syscall.O_CLOEXEC|syscall.O_NOCTTY, perm)
	if err != nil {
		if err == syscall.ENXIO {
			return nil, false, &Error{Code: CodeNotRegular, Message: path + " is not a regular file"}
		}
		return nil, false, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	if err := syscall.Fstat(fd, &st); err != nil {
		syscall.Close(fd)
		return nil, false, &fs.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(fd)
		return nil, false, notRegular(path, st.Mode)
	}
	syscall.SetNonblock(fd, false)
	return os.NewFile(uintptr(fd), path), created, nil
}

func (a *hostConn) handleReadFile(s *astream, payload []byte) (any, error) {
	path, err := a.pathRequest(payload)
	if err != nil {
		return nil, err
	}
	f, _, err := openRegular(path, syscall.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if err := s.send(FrameStarted, startedMsg{Size: st.Size()}); err != nil {
		return nil, err
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	var total int64
	for {
		n, err := f.Read(*bp)
		if n > 0 {
			total += int64(n)
			if err := s.sendData(FrameData, (*bp)[:n]); err != nil {
				return nil, err
			}
		}
		if err == io.EOF {
			return countMsg{Bytes: total}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
	}
}

func (a *hostConn) handleWriteFile(s *astream, payload []byte) (any, error) {
	var req writeFileMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	path, err := a.resolve(req.Path, false)
	if err != nil {
		return nil, err
	}
	if req.Mode&^0o7777 != 0 {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("bad mode %#o", req.Mode)}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating parent directories: %w", err)
	}
	perm := req.Mode
	if perm == 0 {
		perm = 0o644
	}
	f, created, err := openRegular(path, syscall.O_WRONLY|syscall.O_CREAT, perm)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// A new file is empty already: truncating it would add a write event
	// to a watcher's (envd reports a new file's write as create, chmod,
	// write).
	if !created {
		if err := f.Truncate(0); err != nil {
			return nil, fmt.Errorf("truncating %s: %w", path, err)
		}
	}
	if created || req.Mode != 0 { // exact mode, regardless of umask
		if err := syscall.Fchmod(int(f.Fd()), perm); err != nil {
			return nil, fmt.Errorf("chmod %s: %w", path, err)
		}
	}
	var total int64
	for {
		data, eof, err := s.recv()
		if err != nil {
			return nil, err
		}
		if eof {
			break
		}
		n, err := f.Write(data)
		total += int64(n)
		if err != nil {
			return nil, fmt.Errorf("writing %s: %w", path, err)
		}
		s.consumed(len(data))
	}
	if req.SetMetadata {
		if err := replaceMetadata(int(f.Fd()), req.Metadata); err != nil {
			return nil, err
		}
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("closing %s: %w", path, err)
	}
	return countMsg{Bytes: total}, nil
}

func (a *hostConn) handleRemove(s *astream, payload []byte) (any, error) {
	path, err := a.pathRequest(payload)
	if err != nil {
		return nil, err
	}
	if path == "/" {
		return nil, &Error{Code: CodeInvalidArgument, Message: "refusing to remove /"}
	}
	if _, err := os.Lstat(path); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(path); err != nil {
		return nil, err
	}
	return emptyMsg{}, nil
}

func (a *hostConn) handleMkdir(s *astream, payload []byte) (any, error) {
	path, err := a.pathRequest(payload)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, err
	}
	return emptyMsg{}, nil
}

func (a *hostConn) handleMove(s *astream, payload []byte) (any, error) {
	var req moveMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	from, err := a.resolve(req.From, false)
	if err != nil {
		return nil, err
	}
	to, err := a.resolve(req.To, false)
	if err != nil {
		return nil, err
	}
	if err := os.Rename(from, to); err != nil {
		return nil, err
	}
	return emptyMsg{}, nil
}

// fileInfo describes path from its Lstat.
func fileInfo(path string, st os.FileInfo) FileInfo {
	fi := FileInfo{
		Name:    st.Name(),
		Path:    path,
		Size:    st.Size(),
		Mode:    st.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky),
		ModTime: st.ModTime().UTC().Truncate(time.Microsecond),
	}
	switch m := st.Mode(); {
	case m.IsRegular():
		fi.Type = TypeFile
	case m.IsDir():
		fi.Type = TypeDir
	case m&os.ModeSymlink != 0:
		fi.Type = TypeSymlink
		fi.Target, _ = os.Readlink(path)
	default:
		fi.Type = TypeOther
	}
	if path == "/" {
		fi.Name = "/"
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		fi.Owner, fi.Group = idName("u", sys.Uid), idName("g", sys.Gid)
	}
	if fi.Type == TypeFile || fi.Type == TypeDir {
		fi.Metadata = readMetadata(path)
	}
	return fi
}

// idNames caches the names of user ids ("u1000") and group ids ("g1000").
var idNames sync.Map

// idName returns the name lookup finds for id (kind "u" or "g"), or the id
// itself. Names come from the sandbox's /etc/passwd and /etc/group.
func idName(kind string, id uint32) string {
	key := kind + strconv.FormatUint(uint64(id), 10)
	if v, ok := idNames.Load(key); ok {
		return v.(string)
	}
	name := key[1:]
	if kind == "u" {
		if u, err := user.LookupId(name); err == nil {
			name = u.Username
		}
	} else if g, err := user.LookupGroupId(name); err == nil {
		name = g.Name
	}
	idNames.Store(key, name)
	return name
}

func (a *hostConn) handleStat(s *astream, payload []byte) (any, error) {
	path, err := a.pathRequest(payload)
	if err != nil {
		return nil, err
	}
	st, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return fileInfo(path, st), nil
}

func (a *hostConn) handleList(s *astream, payload []byte) (any, error) {
	var req listMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	root, err := a.resolve(req.Path, true)
	if err != nil {
		return nil, err
	}
	depth := req.Depth
	if depth <= 0 {
		depth = 1
	}
	if depth > maxListDepth {
		depth = maxListDepth
	}
	st, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, &Error{Code: CodeNotADirectory, Message: root + " is not a directory"}
	}
	l := lister{s: s}
	if err := l.walk(root, depth, true); err != nil {
		return nil, err
	}
	if err := l.items.flush(s); err != nil {
		return nil, err
	}
	return truncMsg{Truncated: l.truncated}, nil
}

// lister walks a tree depth-first in name order, sending entries as Items.
type lister struct {
	s         *astream
	items     itemWriter
	n         int
	truncated bool
}

func (l *lister) walk(dir string, depth int, top bool) error {
	d, err := os.Open(dir)
	if err != nil {
		if top {
			return err
		}
		return nil // an unreadable subdirectory is listed but not entered
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil && top {
		return fmt.Errorf("reading directory %s: %w", dir, err)
	}
	sort.Strings(names)
	for _, name := range names {
		if l.n >= MaxListEntries {
			l.truncated = true
			return nil
		}
		path := filepath.Join(dir, name)
		st, err := os.Lstat(path)
		if err != nil {
			continue // vanished meanwhile
		}
		l.n++
		if err := l.items.add(l.s, fileInfo(path, st)); err != nil {
			return err
		}
		if st.IsDir() && depth > 1 {
			if err := l.walk(path, depth-1, false); err != nil {
				return err
			}
		}
	}
	return nil
}
