// Package statelock gives one process exclusive use of a state directory:
// an flock on DIR/lock, held for the process's life, with the holder's pid
// written in the file so that a refused second process can name it.
package statelock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FileName is the lock file inside a state directory.
const FileName = "lock"

// HeldError is returned by Acquire when another process holds the lock.
type HeldError struct {
	// Dir is the locked state directory.
	Dir string
	// Pid is the holder's process id, 0 if it could not be read.
	Pid int
}

func (e *HeldError) Error() string {
	who := "another process"
	if e.Pid > 0 {
		who = "process " + strconv.Itoa(e.Pid)
	}
	return fmt.Sprintf("state dir %s is in use by %s (it holds %s); stop it or use another --state-dir",
		e.Dir, who, filepath.Join(e.Dir, FileName))
}

// Lock is a held state-directory lock.
type Lock struct{ f *os.File }

// Acquire locks dir (which must exist) without waiting. It returns a
// *HeldError if another process holds the lock.
func Acquire(dir string) (*Lock, error) {
	path := filepath.Join(dir, FileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &HeldError{Dir: dir, Pid: readPid(path)}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Record the holder. The lock is what counts: a failed write only
	// costs the pid in a later HeldError, and the previous holder's file
	// is overwritten in place (no new block needed on a full disk).
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if _, err := f.WriteAt(pid, 0); err == nil {
		f.Truncate(int64(len(pid)))
	}
	return &Lock{f: f}, nil
}

// Release unlocks. Idempotent.
func (l *Lock) Release() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
