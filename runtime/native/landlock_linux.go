package native

import (
	"encoding/binary"
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
)

// Landlock filesystem access rights, by the ABI that introduced them.
const (
	llExecute    = 1 << 0
	llWriteFile  = 1 << 1
	llReadFile   = 1 << 2
	llReadDir    = 1 << 3
	llRemoveDir  = 1 << 4
	llRemoveFile = 1 << 5
	llMakeChar   = 1 << 6
	llMakeDir    = 1 << 7
	llMakeReg    = 1 << 8
	llMakeSock   = 1 << 9
	llMakeFifo   = 1 << 10
	llMakeBlock  = 1 << 11
	llMakeSym    = 1 << 12
	llRefer      = 1 << 13 // ABI 2
	llTruncate   = 1 << 14 // ABI 3
	llIoctlDev   = 1 << 15 // ABI 5

	llScopeAbstractUnix = 1 << 0 // ABI 6
	llScopeSignal       = 1 << 1 // ABI 6
)

var (
	landlockOnce sync.Once
	landlockABIv int
	landlockErr  error
)

// LandlockABI returns the kernel's Landlock ABI version, or 0 and the reason.
func LandlockABI() (int, error) {
	landlockOnce.Do(func() {
		r, _, e := syscall.RawSyscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
		if e != 0 {
			landlockErr = fmt.Errorf("landlock unavailable: %w", e)
			return
		}
		landlockABIv = int(r)
	})
	return landlockABIv, landlockErr
}

// handledFS returns every filesystem right the ABI knows.
func handledFS(abi int) uint64 {
	h := uint64(llExecute | llWriteFile | llReadFile | llReadDir | llRemoveDir | llRemoveFile | llMakeChar |
		llMakeDir | llMakeReg | llMakeSock | llMakeFifo | llMakeBlock | llMakeSym)
	if abi >= 2 {
		h |= llRefer
	}
	if abi >= 3 {
		h |= llTruncate
	}
	if abi >= 5 {
		h |= llIoctlDev
	}
	return h
}

// landlockPlan builds the ruleset attribute and the rules: read and execute
// everywhere, write only in /workspace, /tmp, /dev/shm and writable mounts,
// devices usable in /dev, and /proc read-only. With ABI 6 the sandbox is also scoped: it can
// neither signal nor reach abstract unix sockets outside itself.
func landlockPlan(p *policy.Policy, abi int) (attr []byte, rules []llRule) {
	handled := handledFS(abi)
	size := 8
	if abi >= 4 {
		size = 16
	}
	if abi >= 6 {
		size = 24
	}
	attr = make([]byte, size)
	binary.LittleEndian.PutUint64(attr[0:], handled)
	if abi >= 6 {
		binary.LittleEndian.PutUint64(attr[16:], llScopeAbstractUnix|llScopeSignal)
	}
	ro := uint64(llExecute | llReadFile | llReadDir)
	rule := func(path string, access uint64) {
		var r llRule
		r.path = cstr(path)
		binary.LittleEndian.PutUint64(r.attr.raw[0:], access&handled)
		rules = append(rules, r)
	}
	rule("/", ro)
	rule("/proc", ro) // writes to /proc/self/* are refused: nothing needs them
	rule("/dev", ro|llWriteFile|llTruncate|llIoctlDev)
	for _, w := range []string{"/workspace", "/tmp", "/dev/shm"} {
		rule(w, handled)
	}
	for _, m := range p.Filesystem.Mounts {
		if m.Writable {
			rule(m.Target, handled)
		}
	}
	return attr, rules
}
