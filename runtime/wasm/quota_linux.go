package wasm

import (
	"io"
	"os"
	"sync"
	"syscall"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// quota caps what one run adds to one writable preopen: bytes (the
// policy's disk limit), inodes (files and directories created) and the
// size of any one file. It counts growth this run causes and credits
// what it removes; what was there before the run is not counted. A
// refusal is EIO: wazero's WASI errno set has no ENOSPC or EFBIG.
type quota struct {
	mu               sync.Mutex
	bytes, inodes    int64
	maxBytes, maxIno int64
	maxFile          int64
}

// grow reserves n more bytes for a file that would end at end; it
// reports whether that fits.
func (q *quota) grow(n, end int64) bool {
	if q == nil {
		return true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if end > q.maxFile || (n > 0 && q.bytes+n > q.maxBytes) {
		return false
	}
	q.bytes += max(n, 0)
	return true
}

func (q *quota) release(n int64) {
	if q == nil || n <= 0 {
		return
	}
	q.mu.Lock()
	q.bytes = max(q.bytes-n, 0)
	q.mu.Unlock()
}

// inode takes (d=1) or gives back (d=-1) an inode; it reports whether
// taking one fits.
func (q *quota) inode(d int64) bool {
	if q == nil {
		return true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if d > 0 && q.inodes+d > q.maxIno {
		return false
	}
	q.inodes = max(q.inodes+d, 0)
	return true
}

// growth is how many bytes writing n bytes at off adds to f.
func growth(f *os.File, off, n int64) (int64, int64, experimentalsys.Errno) {
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, errno(err)
	}
	end := off + n
	return max(end-fi.Size(), 0), end, 0
}

// checkWrite checks a write of b at off (-1: the current offset, or the end
// for append) against the quota, then does it.
func (f *rootFile) checkWrite(b []byte, off int64) experimentalsys.Errno {
	if f.q == nil {
		return 0
	}
	if off < 0 {
		var err error
		if f.append {
			var fi os.FileInfo
			if fi, err = f.f.Stat(); err == nil {
				off = fi.Size()
			}
		} else {
			off, err = f.f.Seek(0, io.SeekCurrent)
		}
		if err != nil {
			return errno(err)
		}
	}
	n, end, e := growth(f.f, off, int64(len(b)))
	if e != 0 {
		return e
	}
	if !f.q.grow(n, end) {
		return experimentalsys.EIO
	}
	return 0
}

// lastLink reports whether removing this name frees the file.
func lastLink(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Nlink == 1
}
