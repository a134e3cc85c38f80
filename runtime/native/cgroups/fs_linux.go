package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The helpers below use raw syscalls rather than os.File: cgroupfs files
// are tiny, never pollable, and the hot path opens a dozen of them per
// sandbox.

// writeFile writes data to an existing cgroupfs file with a single write.
func writeFile(path, data string) error {
	fd, err := openRetry(path, unix.O_WRONLY|unix.O_CLOEXEC)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	_, err = unix.Write(fd, []byte(data))
	for err == unix.EINTR {
		_, err = unix.Write(fd, []byte(data))
	}
	unix.Close(fd)
	if err != nil {
		return &os.PathError{Op: "write " + strconv.Quote(data), Path: path, Err: err}
	}
	return nil
}

// writeInt writes a decimal integer to a cgroupfs file.
func writeInt(path string, v int64) error {
	return writeFile(path, strconv.FormatInt(v, 10))
}

// readSmall reads a cgroupfs file of at most a few hundred bytes into buf
// and returns the filled part.
func readSmall(path string, buf []byte) ([]byte, error) {
	fd, err := openRetry(path, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			break
		}
		n += m
	}
	return buf[:n], nil
}

func openRetry(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// readInt reads a file holding one decimal integer ("max" reads as -1).
func readInt(path string) (int64, error) {
	var b [64]byte
	data, err := readSmall(path, b[:])
	if err != nil {
		return 0, err
	}
	data = bytes.TrimSpace(data)
	if string(data) == "max" {
		return -1, nil
	}
	v, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}

// readKey reads the value of key from a flat-keyed file ("key value" per
// line, e.g. memory.events, cpu.stat, memory.oom_control). found is false
// when the key is absent.
func readKey(path, key string) (v int64, found bool, err error) {
	var b [4096]byte
	data, err := readSmall(path, b[:])
	if err != nil {
		return 0, false, err
	}
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		k, val, ok := bytes.Cut(line, []byte{' '})
		if !ok || string(k) != key {
			continue
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(val)), 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("parse %s %s: %w", path, key, err)
		}
		return n, true, nil
	}
	return 0, false, nil
}

// readPids lists the process ids in a cgroup.procs file.
func readPids(path string) ([]int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pids []int
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if len(line) == 0 {
			continue
		}
		pid, err := strconv.Atoi(string(line))
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// isEmpty reports whether a cgroup.procs file lists no process. A missing
// file counts as empty.
func isEmpty(procsPath string) (bool, error) {
	var b [16]byte
	data, err := readSmall(procsPath, b[:])
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return true, nil
		}
		return false, err
	}
	return len(bytes.TrimSpace(data)) == 0, nil
}

// backoff sleeps for *d and doubles it up to max. The first waits are short
// because a SIGKILLed process usually exits within tens of microseconds.
func backoff(d *time.Duration, max time.Duration) {
	time.Sleep(*d)
	if *d *= 2; *d > max {
		*d = max
	}
}
