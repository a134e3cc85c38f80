package native

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ProcStartTime returns field 22 of /proc/PID/stat: when the process
// started, in clock ticks since boot. With the pid it identifies a process
// even if the pid is later reused.
func ProcStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces and parentheses: split after
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return 0, errors.New("short stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// PidfdExited reports whether the process of pidfd fd has exited (a zombie
// still passes pidfd_open and keeps its start time: it must not be taken
// for a live process).
func PidfdExited(fd int) bool {
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
	return err == nil && n > 0
}
