package agent

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// guardAgentID installs, on every thread of the agent (and so on every
// process it starts), a seccomp filter that refuses (EPERM) the set*id
// calls naming id: a root workload keeps CAP_SETUID (RootCaps), and must
// not become the agent's uid, which would let it signal or prlimit the
// agent. The native runtime's filter does the same (seccomp.Guards
// ProtectID); under gVisor the agent installs it itself, once it has
// taken id (becomeRootAgent), and gVisor enforces it. Another
// architecture than the filter knows kills the caller.
func guardAgentID(id int) error {
	arch, ok := map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}[runtime.GOARCH]
	if !ok {
		return fmt.Errorf("no set*id guard for %s", runtime.GOARCH)
	}
	calls := []struct {
		nr   uint32
		args int
	}{
		{unix.SYS_SETUID, 1}, {unix.SYS_SETGID, 1}, {unix.SYS_SETFSUID, 1}, {unix.SYS_SETFSGID, 1},
		{unix.SYS_SETREUID, 2}, {unix.SYS_SETREGID, 2}, {unix.SYS_SETRESUID, 3}, {unix.SYS_SETRESGID, 3},
	}
	const (
		ldW   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeqK  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		retK  = unix.BPF_RET | unix.BPF_K
		allow = unix.SECCOMP_RET_ALLOW
		eperm = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	)
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jump := func(k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: jeqK, Jt: jt, Jf: jf, K: k}
	}
	prog := []unix.SockFilter{
		stmt(ldW, 4), // seccomp_data.arch
		jump(arch, 1, 0),
		stmt(retK, unix.SECCOMP_RET_KILL_PROCESS),
	}
	for _, c := range calls {
		// nr == c.nr: check its id arguments (low 32 bits, little
		// endian), else skip this block.
		block := []unix.SockFilter{}
		for i := 0; i < c.args; i++ {
			block = append(block, stmt(ldW, uint32(16+8*i)), jump(uint32(id), 0, 1), stmt(retK, eperm))
		}
		block = append(block, stmt(retK, allow))
		prog = append(prog, stmt(ldW, 0), jump(c.nr, 0, uint8(len(block))))
		prog = append(prog, block...)
	}
	prog = append(prog, stmt(retK, allow))
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fp))); e != 0 {
		return fmt.Errorf("seccomp set*id guard for uid %d: %w", id, e)
	}
	return nil
}
