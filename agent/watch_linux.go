package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"unsafe"
)

// Directory watches with inotify. A watch is one inotify instance; a
// recursive one adds a watch for every directory below the root, and for
// each directory that appears later (reporting what was created in it
// before its watch was in place). Events are sent in batches of whole JSON
// lines, each batch at most maxWatchBatch bytes.

// watchMask is what a watched directory reports.
const watchMask = syscall.IN_CREATE | syscall.IN_MODIFY | syscall.IN_DELETE | syscall.IN_MOVED_FROM |
	syscall.IN_MOVED_TO | syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF |
	syscall.IN_ONLYDIR | syscall.IN_EXCL_UNLINK

// maxWatchBatch bounds one Items frame of a watch (sendWhole needs at most
// InitialWindow/2).
const maxWatchBatch = InitialWindow / 4

// inotifyWatch is one watch's inotify instance and the directories it
// follows.
type inotifyWatch struct {
	f         *os.File
	fd        int
	root      string
	recursive bool

	mu   sync.Mutex
	dirs map[int32]string // watch descriptor → directory
}

func (c *hostConn) handleWatch(s *astream, payload []byte) (any, error) {
	var req watchMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	root, err := c.resolve(req.Path, false)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(root); err != nil {
		return nil, err
	} else if !st.IsDir() {
		return nil, &Error{Code: CodeNotADirectory, Message: root + " is not a directory"}
	}
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return nil, inotifyErr(err)
	}
	w := &inotifyWatch{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, root: root, recursive: req.Recursive,
		dirs: map[int32]string{}}
	defer w.f.Close()
	if _, err := w.add(root); err != nil {
		return nil, err
	}
	if req.Recursive {
		if _, err := w.addTree(root); err != nil {
			return nil, err
		}
	}
	s.onGone(func() { w.f.Close() }) // ends the read below
	if err := s.send(FrameStarted, emptyMsg{}); err != nil {
		return nil, errStreamGone
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil, errStreamGone
			}
			return nil, fmt.Errorf("reading inotify events: %w", err)
		}
		evs, rootGone, err := w.parse(buf[:n])
		if err != nil {
			return nil, err
		}
		if err := sendWatchEvents(s, evs); err != nil {
			return nil, err
		}
		if rootGone {
			return emptyMsg{}, nil
		}
	}
}

// add watches one directory.
func (w *inotifyWatch) add(dir string) (int32, error) {
	wd, err := syscall.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return 0, inotifyErr(fmt.Errorf("watching %s: %w", dir, err))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, known := w.dirs[int32(wd)]; !known && len(w.dirs) >= MaxWatchDirs {
		syscall.InotifyRmWatch(w.fd, uint32(wd))
		return 0, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("%s has more than %d directories: too many to watch", w.root, MaxWatchDirs)}
	}
	w.dirs[int32(wd)] = dir
	return int32(wd), nil
}

// addTree watches the directories below dir and returns the paths found
// there (for a directory that appeared while watched: what was created in
// it before its watch was in place).
func (w *inotifyWatch) addTree(dir string) ([]string, error) {
	var found []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // vanished meanwhile, or unreadable: skip it
		}
		if p == dir {
			return nil
		}
		found = append(found, p)
		if d.IsDir() {
			if _, err := w.add(p); err != nil {
				var ae *Error
				if errors.As(err, &ae) && ae.Code == CodeTooLarge {
					return err
				}
				return fs.SkipDir
			}
		}
		return nil
	})
	return found, err
}

// parse decodes a read of inotify events. rootGone reports that the
// watched directory itself was removed or moved.
func (w *inotifyWatch) parse(b []byte) (evs []WatchEvent, rootGone bool, err error) {
	for len(b) >= syscall.SizeofInotifyEvent {
		raw := (*syscall.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := syscall.SizeofInotifyEvent + int(raw.Len)
		if end > len(b) {
			break
		}
		name := string(bytesBeforeNUL(b[syscall.SizeofInotifyEvent:end]))
		b = b[end:]
		mask := raw.Mask
		if mask&syscall.IN_Q_OVERFLOW != 0 {
			return evs, false, &Error{Code: CodeTooLarge, Message: "too many changes at once: the kernel's inotify queue overflowed"}
		}
		w.mu.Lock()
		dir, ok := w.dirs[raw.Wd]
		if mask&syscall.IN_IGNORED != 0 {
			delete(w.dirs, raw.Wd)
		}
		w.mu.Unlock()
		if !ok {
			continue
		}
		if mask&(syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF) != 0 {
			if dir == w.root {
				return evs, true, nil
			}
			continue // its parent reports it
		}
		if name == "" {
			continue
		}
		p := filepath.Join(dir, name)
		switch {
		case mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
			evs = append(evs, WatchEvent{Op: WatchCreate, Path: p})
			if w.recursive && mask&syscall.IN_ISDIR != 0 {
				if _, err := w.add(p); err != nil {
					return evs, false, err
				}
				found, err := w.addTree(p)
				if err != nil {
					return evs, false, err
				}
				for _, f := range found {
					evs = append(evs, WatchEvent{Op: WatchCreate, Path: f})
				}
			}
		case mask&syscall.IN_MODIFY != 0:
			evs = append(evs, WatchEvent{Op: WatchWrite, Path: p})
		case mask&syscall.IN_DELETE != 0:
			evs = append(evs, WatchEvent{Op: WatchRemove, Path: p})
		case mask&syscall.IN_MOVED_FROM != 0:
			evs = append(evs, WatchEvent{Op: WatchRename, Path: p})
		case mask&syscall.IN_ATTRIB != 0:
			evs = append(evs, WatchEvent{Op: WatchChmod, Path: p})
		}
	}
	return evs, false, nil
}

// sendWatchEvents sends events as Items frames of whole lines.
func sendWatchEvents(s *astream, evs []WatchEvent) error {
	var batch []byte
	for _, ev := range evs {
		line, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if len(batch)+len(line)+1 > maxWatchBatch && len(batch) > 0 {
			if err := s.sendWhole(FrameItems, batch); err != nil {
				return err
			}
			batch = nil
		}
		batch = append(append(batch, line...), '\n')
	}
	if len(batch) > 0 {
		return s.sendWhole(FrameItems, batch)
	}
	return nil
}

// inotifyErr explains the inotify limits, which are per sandbox user.
func inotifyErr(err error) error {
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENOSPC) {
		return &Error{Code: CodeTooLarge, Message: fmt.Sprintf("%v: the sandbox's inotify limit (instances or watches) is reached", err)}
	}
	return err
}

func bytesBeforeNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}
