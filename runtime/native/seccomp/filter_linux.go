//go:build linux

package seccomp

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	gbpf "gvisor.dev/gvisor/pkg/bpf"
	gseccomp "gvisor.dev/gvisor/pkg/seccomp"

	"golang.org/x/sys/unix"
)

// Profile names accepted by Build.
const (
	// ProfileStrict denies every call on the list; it is the default.
	ProfileStrict = "strict"
	// ProfileStandard is currently identical to ProfileStrict.
	ProfileStandard = "standard"
	// ProfileLight is strict plus what debuggers need: ptrace,
	// process_vm_readv/writev, kcmp, any personality and AF_NETLINK sockets.
	ProfileLight = "light"
)

// Filter is a compiled seccomp-bpf program ready for
// seccomp(SECCOMP_SET_MODE_FILTER).
//
// Filters returned by Build are shared between callers and must be treated
// as read-only.
type Filter struct {
	// Instructions is the classic BPF program, in kernel layout.
	Instructions []unix.SockFilter
	// Profile is the profile the program was compiled for: "strict",
	// "standard" or "light".
	Profile string
	// Denied is the number of system calls that have at least one rule
	// that denies them (unconditionally or depending on their arguments).
	Denied int

	guards string // what Guards added, for Describe
}

// cacheEntry holds the lazily compiled filter of one profile.
type cacheEntry struct {
	once   sync.Once
	filter *Filter
	err    error
}

// cache has one entry per known profile; the map itself is never written
// after init, so reading it needs no lock.
var cache = map[string]*cacheEntry{
	ProfileStrict:   {},
	ProfileStandard: {},
	ProfileLight:    {},
}

// Build compiles the filter for a profile name ("strict", "standard",
// "light"; "" means strict). The result is compiled once per profile and
// cached, so later calls are cheap; callers must not modify it.
func Build(profile string) (*Filter, error) {
	if profile == "" {
		profile = ProfileStrict
	}
	entry, ok := cache[profile]
	if !ok {
		return nil, fmt.Errorf("seccomp: unknown profile %q (want %q, %q or %q)",
			profile, ProfileStrict, ProfileStandard, ProfileLight)
	}
	entry.once.Do(func() {
		if p, ok := precompiled[profile]; ok {
			// Compiling costs milliseconds per process (a whole CLI run's
			// worth); the generated table is checked against compile() by
			// TestPrecompiledUpToDate.
			entry.filter = &Filter{Instructions: p.insns, Profile: profile, Denied: p.denied}
			return
		}
		entry.filter, entry.err = compile(profile, Guards{})
	})
	return entry.filter, entry.err
}

// Guards are rules added to a profile for sandboxes that need them. They
// are compiled into the profile's program (one filter, not a stacked
// second one) on first use and cached per combination.
type Guards struct {
	// NoSetID refuses (EPERM) every way of giving a file a set-uid or
	// set-gid mode: chmod, fchmod, fchmodat and fchmodat2 with S_ISUID or
	// S_ISGID in the mode, open, openat and creat that create a file
	// (O_CREAT or O_TMPFILE) with such a mode, and mknod/mknodat with one.
	// openat2, whose mode sits in a struct the filter cannot read, is
	// refused with ENOSYS (libc falls back to openat). For sandboxes with
	// ID-mapped host directories, whose files the host can execute.
	NoSetID bool
	// ProtectID, when not 0, refuses (EPERM) setuid, setgid, setreuid,
	// setregid, setresuid, setresgid, setfsuid and setfsgid with this id in
	// any argument: a workload holding CAP_SETUID inside its namespace
	// (user root) cannot become the agent's uid. setgroups is not among
	// them: its group list is in memory the filter cannot read, so the
	// native runtime gives such a sandbox's agent no group of its own
	// (native.AgentUID).
	ProtectID int
	// Clone3 lets clone3 through instead of answering ENOSYS: a native
	// agent on cgroup v2 clones every workload process straight into the
	// workload's cgroup leaf (CLONE_INTO_CGROUP), which only clone3 can.
	// clone3's flags sit in memory the filter cannot read, so the
	// namespace flags refused for clone(2) are refused by the kernel
	// instead: the launcher sets every max_*_namespaces limit of the
	// sandbox's user namespace to 0 (native.Start).
	Clone3 bool
}

// guarded caches the compiled filters of profiles with guards.
var guarded sync.Map // guardKey -> *cacheEntry

type guardKey struct {
	profile string
	guards  Guards
}

// BuildWith compiles the filter of a profile with guards. Without guards it
// is Build. Results are cached per profile and guards and must not be
// modified.
func BuildWith(profile string, g Guards) (*Filter, error) {
	if g == (Guards{}) {
		return Build(profile)
	}
	if profile == "" {
		profile = ProfileStrict
	}
	if _, ok := cache[profile]; !ok {
		return Build(profile) // the unknown-profile error
	}
	v, _ := guarded.LoadOrStore(guardKey{profile, g}, &cacheEntry{})
	entry := v.(*cacheEntry)
	entry.once.Do(func() { entry.filter, entry.err = compile(profile, g) })
	return entry.filter, entry.err
}

// Describe returns a one-line summary for reports, e.g.
// "seccomp-bpf strict: 74 denied calls, foreign ABIs killed".
func (f *Filter) Describe() string {
	return fmt.Sprintf("seccomp-bpf %s: %d denied calls%s, foreign ABIs killed", f.Profile, f.Denied, f.guards)
}

// Prog returns the sock_fprog that points at f.Instructions, as the third
// argument of seccomp(SECCOMP_SET_MODE_FILTER, flags, prog). Prepare it
// before fork so the child only has to make the raw system call. The result
// refers to f's memory: keep f alive until the system call returns. An
// empty filter gives an empty sock_fprog, which the kernel rejects.
func (f *Filter) Prog() *unix.SockFprog {
	if len(f.Instructions) == 0 {
		return &unix.SockFprog{}
	}
	return &unix.SockFprog{
		Len:    uint16(len(f.Instructions)),
		Filter: &f.Instructions[0],
	}
}

// Install sets no_new_privs and installs the filter on every thread of the
// calling process (SECCOMP_FILTER_FLAG_TSYNC). It cannot be undone; it is
// meant for a process that is about to execve the sandboxed program.
func (f *Filter) Install() error {
	if len(f.Instructions) == 0 {
		return fmt.Errorf("seccomp: install %s filter: empty program", f.Profile)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	prog := f.Prog()
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(prog)))
	runtime.KeepAlive(f)
	if errno != 0 {
		return fmt.Errorf("seccomp: install %s filter: %w", f.Profile, errno)
	}
	if r != 0 {
		return fmt.Errorf("seccomp: install %s filter: thread %d could not be synchronized", f.Profile, r)
	}
	return nil
}

// compile builds the program of one profile, with guards, from the
// architecture's rules.
func compile(profile string, g Guards) (*Filter, error) {
	rules, err := profileRules(profile, g)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %s profile: %w", profile, err)
	}
	prog := gseccomp.Program{
		RuleSets: rules.sets,
		Options: gseccomp.ProgramOptions{
			DefaultAction: gseccomp.Allow,
			BadArchAction: gseccomp.KillProcess,
		},
	}
	body, _, err := prog.Build()
	if err != nil {
		return nil, fmt.Errorf("seccomp: compile %s profile: %w", profile, err)
	}
	insns := append(abiPrelude(), body...)
	if len(insns) > gbpf.MaxInstructions {
		return nil, fmt.Errorf("seccomp: %s profile: %d instructions exceed the kernel limit of %d",
			profile, len(insns), gbpf.MaxInstructions)
	}
	out := make([]unix.SockFilter, len(insns))
	for i, in := range insns {
		out[i] = unix.SockFilter{Code: in.OpCode, Jt: in.JumpIfTrue, Jf: in.JumpIfFalse, K: in.K}
	}
	var desc string
	if g.NoSetID {
		desc += "; set-uid/set-gid modes refused"
	}
	if g.ProtectID != 0 {
		desc += fmt.Sprintf("; set*id to %d refused", g.ProtectID)
	}
	if g.Clone3 {
		desc += "; clone3 allowed (new namespaces refused by the user namespace's limits)"
	}
	return &Filter{Instructions: out, Profile: profile, Denied: rules.denied, guards: desc}, nil
}

// Offsets into struct seccomp_data.
const (
	offsetNR   = 0
	offsetArch = 4
)

// abiPrelude returns the instructions that run before gVisor's rule program:
// a call from any architecture but the native one, or through the x32 ABI
// (syscall number with __X32_SYSCALL_BIT), kills the process. Number -1 is
// let through, as libseccomp does: tracers use it to skip a call, and the
// kernel answers it with ENOSYS.
//
// Every jump stays inside the prelude or lands on the instruction right
// after it, so the prelude can be put in front of any program.
func abiPrelude() []gbpf.Instruction {
	kill := uint32(unix.SECCOMP_RET_KILL_PROCESS)
	return []gbpf.Instruction{
		/* 0 */ gbpf.Stmt(gbpf.Ld|gbpf.Abs|gbpf.W, offsetArch),
		/* 1 */ gbpf.Jump(gbpf.Jmp|gbpf.Jeq|gbpf.K, nativeAuditArch, 1, 0),
		/* 2 */ gbpf.Stmt(gbpf.Ret|gbpf.K, kill),
		/* 3 */ gbpf.Stmt(gbpf.Ld|gbpf.Abs|gbpf.W, offsetNR),
		/* 4 */ gbpf.Jump(gbpf.Jmp|gbpf.Jge|gbpf.K, foreignSyscallBit, 0, 2),
		/* 5 */ gbpf.Jump(gbpf.Jmp|gbpf.Jeq|gbpf.K, 0xffffffff, 1, 0),
		/* 6 */ gbpf.Stmt(gbpf.Ret|gbpf.K, kill),
	}
}

// ruleSets is what an architecture contributes to a profile.
type ruleSets struct {
	sets   []gseccomp.RuleSet
	denied int
}
