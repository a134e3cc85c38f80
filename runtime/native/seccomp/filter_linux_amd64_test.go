//go:build linux && amd64

package seccomp

import (
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/abi/linux"
	gbpf "gvisor.dev/gvisor/pkg/bpf"
	gseccomp "gvisor.dev/gvisor/pkg/seccomp"

	"golang.org/x/sys/unix"
)

// Seccomp return values the tests expect.
const (
	retAllow   = uint32(unix.SECCOMP_RET_ALLOW)
	retKill    = uint32(unix.SECCOMP_RET_KILL_PROCESS)
	retEPERM   = uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.EPERM)
	retENOSYS  = uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.ENOSYS)
	retEAFNOSU = uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.EAFNOSUPPORT)
)

// evaluator runs a compiled Filter in gVisor's BPF interpreter.
type evaluator struct {
	t    *testing.T
	prog gbpf.Program
}

func newEvaluator(t *testing.T, profile string) *evaluator {
	t.Helper()
	return guardedEvaluator(t, profile, Guards{})
}

// guardedEvaluator is newEvaluator for a profile with guards.
func guardedEvaluator(t *testing.T, profile string, g Guards) *evaluator {
	t.Helper()
	f, err := BuildWith(profile, g)
	if err != nil {
		t.Fatalf("BuildWith(%q, %+v): %v", profile, g, err)
	}
	insns := make([]gbpf.Instruction, len(f.Instructions))
	for i, in := range f.Instructions {
		insns[i] = gbpf.Instruction{OpCode: in.Code, JumpIfTrue: in.Jt, JumpIfFalse: in.Jf, K: in.K}
	}
	prog, err := gbpf.Compile(insns, false)
	if err != nil {
		t.Fatalf("Build(%q) produced an invalid program: %v", profile, err)
	}
	return &evaluator{t: t, prog: prog}
}

// run evaluates one system call made with the given arch, number and args.
func (e *evaluator) run(arch uint32, nr int32, args ...uint64) uint32 {
	e.t.Helper()
	d := linux.SeccompData{Nr: nr, Arch: arch, InstructionPointer: 0x401000}
	copy(d.Args[:], args)
	buf := make([]byte, d.SizeBytes())
	ret, err := gbpf.Exec[gbpf.NativeEndian](e.prog, gseccomp.DataAsBPFInput(&d, buf))
	if err != nil {
		e.t.Fatalf("exec filter on nr=%d: %v", nr, err)
	}
	return ret
}

// call evaluates a native x86_64 system call.
func (e *evaluator) call(nr uintptr, args ...uint64) uint32 {
	e.t.Helper()
	return e.run(unix.AUDIT_ARCH_X86_64, int32(nr), args...)
}

type interpCase struct {
	name string
	nr   uintptr
	args []uint64
	want uint32
}

// commonCases hold for every profile.
func commonCases() []interpCase {
	threadFlags := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_SYSVSEM | unix.CLONE_THREAD | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID |
		unix.CLONE_CHILD_CLEARTID)
	cases := []interpCase{
		{"read", unix.SYS_READ, nil, retAllow},
		{"execve", unix.SYS_EXECVE, nil, retAllow},
		{"epoll_pwait", unix.SYS_EPOLL_PWAIT, nil, retAllow},
		{"wait4", unix.SYS_WAIT4, nil, retAllow},
		{"prctl", unix.SYS_PRCTL, []uint64{unix.PR_SET_NO_NEW_PRIVS, 1}, retAllow},
		{"seccomp", unix.SYS_SECCOMP, nil, retAllow},
		{"sethostname", unix.SYS_SETHOSTNAME, nil, retAllow},
		{"landlock_create_ruleset", unix.SYS_LANDLOCK_CREATE_RULESET, nil, retAllow},
		{"clone_thread", unix.SYS_CLONE, []uint64{threadFlags}, retAllow},
		{"clone_fork", unix.SYS_CLONE, []uint64{uint64(unix.SIGCHLD)}, retAllow},
		{"clone_vfork_pidfd", unix.SYS_CLONE, []uint64{unix.CLONE_VFORK | unix.CLONE_VM | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)}, retAllow},
		{"clone_newuser", unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, retEPERM},
		{"clone_newns", unix.SYS_CLONE, []uint64{unix.CLONE_NEWNS}, retEPERM},
		{"clone_newnet_thread", unix.SYS_CLONE, []uint64{threadFlags | unix.CLONE_NEWNET}, retEPERM},
		{"clone_newcgroup_high", unix.SYS_CLONE, []uint64{1<<40 | unix.CLONE_NEWCGROUP}, retEPERM},
		{"clone_newtime", unix.SYS_CLONE, []uint64{unix.CLONE_NEWTIME}, retEPERM},
		{"clone3", unix.SYS_CLONE3, nil, retENOSYS},
		{"fsopen", unix.SYS_FSOPEN, nil, retENOSYS},
		{"open_tree", unix.SYS_OPEN_TREE, nil, retENOSYS},
		{"mount_setattr", unix.SYS_MOUNT_SETATTR, nil, retENOSYS},
		{"mount", unix.SYS_MOUNT, nil, retEPERM},
		{"unshare", unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER}, retEPERM},
		{"io_uring_setup", unix.SYS_IO_URING_SETUP, nil, retEPERM},
		{"bpf", unix.SYS_BPF, nil, retEPERM},
		{"iopl", unix.SYS_IOPL, nil, retEPERM},
		{"modify_ldt_read", unix.SYS_MODIFY_LDT, []uint64{0}, retEPERM},
		{"modify_ldt_write", unix.SYS_MODIFY_LDT, []uint64{1}, retEPERM},
		{"pidfd_getfd", unix.SYS_PIDFD_GETFD, nil, retEPERM},
		{"ioctl_tcgets", unix.SYS_IOCTL, []uint64{0, unix.TCGETS}, retAllow},
		{"ioctl_fionread", unix.SYS_IOCTL, []uint64{3, unix.TIOCINQ}, retAllow},
		{"ioctl_tiocsti", unix.SYS_IOCTL, []uint64{0, unix.TIOCSTI}, retEPERM},
		{"ioctl_tiocsti_high", unix.SYS_IOCTL, []uint64{0, 0xffffffff00005412}, retEPERM},
		{"ioctl_tioclinux", unix.SYS_IOCTL, []uint64{0, unix.TIOCLINUX}, retEPERM},
		{"ioctl_tioclinux_high", unix.SYS_IOCTL, []uint64{0, 1<<32 | unix.TIOCLINUX}, retEPERM},
		{"socket_unix", unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM}, retAllow},
		{"socket_inet", unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_DGRAM}, retAllow},
		{"socket_inet6_high", unix.SYS_SOCKET, []uint64{1<<32 | unix.AF_INET6}, retAllow},
		{"socketpair_unix", unix.SYS_SOCKETPAIR, []uint64{unix.AF_UNIX}, retAllow},
		{"socket_packet", unix.SYS_SOCKET, []uint64{unix.AF_PACKET}, retEAFNOSU},
		{"socket_alg", unix.SYS_SOCKET, []uint64{unix.AF_ALG}, retEAFNOSU},
		{"socket_vsock", unix.SYS_SOCKET, []uint64{unix.AF_VSOCK}, retEAFNOSU},
		{"socketpair_alg", unix.SYS_SOCKETPAIR, []uint64{unix.AF_ALG}, retEAFNOSU},
		{"personality_query", unix.SYS_PERSONALITY, []uint64{0xffffffff}, retAllow},
		{"personality_linux", unix.SYS_PERSONALITY, []uint64{0}, retAllow},
		{"personality_uname26", unix.SYS_PERSONALITY, []uint64{0x20008}, retAllow},
		{"syscall_minus_one", ^uintptr(0), nil, retAllow},
		{"x32_read", foreignSyscallBit | unix.SYS_READ, nil, retKill},
		{"x32_execve", foreignSyscallBit | 520, nil, retKill},
		{"huge_number", 0x7fffffff, nil, retKill},
		{"unknown_number", 1000, nil, retAllow},
	}
	return cases
}

func TestFilterDecisions(t *testing.T) {
	for _, profile := range []string{ProfileStrict, ProfileStandard, ProfileLight} {
		t.Run(profile, func(t *testing.T) {
			e := newEvaluator(t, profile)
			light := profile == ProfileLight
			cases := commonCases()
			ifLight := func(yes, no uint32) uint32 {
				if light {
					return yes
				}
				return no
			}
			cases = append(cases,
				interpCase{"ptrace", unix.SYS_PTRACE, []uint64{unix.PTRACE_ATTACH, 1}, ifLight(retAllow, retEPERM)},
				interpCase{"process_vm_readv", unix.SYS_PROCESS_VM_READV, nil, ifLight(retAllow, retEPERM)},
				interpCase{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV, nil, ifLight(retAllow, retEPERM)},
				interpCase{"kcmp", unix.SYS_KCMP, nil, ifLight(retAllow, retEPERM)},
				interpCase{"personality_bad", unix.SYS_PERSONALITY, []uint64{0x0400000}, ifLight(retAllow, retEPERM)},
				interpCase{"personality_noaslr", unix.SYS_PERSONALITY, []uint64{0x0040000}, ifLight(retAllow, retEPERM)},
				interpCase{"socket_netlink", unix.SYS_SOCKET, []uint64{unix.AF_NETLINK}, ifLight(retAllow, retEAFNOSU)},
			)
			for _, c := range cases {
				if got := e.call(c.nr, c.args...); got != c.want {
					t.Errorf("%s: filter returned %#x, want %#x", c.name, got, c.want)
				}
			}
			for _, nr := range epermCalls {
				if got := e.call(nr); got != retEPERM {
					t.Errorf("syscall %d: filter returned %#x, want EPERM", nr, got)
				}
			}
			for _, nr := range enosysCalls {
				if got := e.call(nr); got != retENOSYS {
					t.Errorf("syscall %d: filter returned %#x, want ENOSYS", nr, got)
				}
			}
			for _, arch := range []uint32{unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_AARCH64, 0} {
				// getpid on i386 is 20; any call from a foreign arch dies.
				if got := e.run(arch, 20); got != retKill {
					t.Errorf("arch %#x: filter returned %#x, want KILL_PROCESS", arch, got)
				}
			}
		})
	}
}

func TestBuildProfiles(t *testing.T) {
	strict, err := Build("")
	if err != nil {
		t.Fatal(err)
	}
	if strict.Profile != ProfileStrict {
		t.Errorf(`Build("").Profile = %q, want strict`, strict.Profile)
	}
	again, err := Build(ProfileStrict)
	if err != nil {
		t.Fatal(err)
	}
	if again != strict {
		t.Error("Build does not return the cached filter")
	}
	light, err := Build(ProfileLight)
	if err != nil {
		t.Fatal(err)
	}
	if light.Denied != strict.Denied-len(debugCalls)-1 {
		t.Errorf("light denies %d calls, strict %d: want %d fewer (debug calls + personality)",
			light.Denied, strict.Denied, len(debugCalls)+1)
	}
	// Every deny list entry, plus clone, personality, ioctl, socket and socketpair.
	if want := len(epermCalls) + len(debugCalls) + len(enosysCalls) + 5; strict.Denied != want {
		t.Errorf("strict Denied = %d, want %d", strict.Denied, want)
	}
	d := strict.Describe()
	if !strings.HasPrefix(d, "seccomp-bpf strict: ") || !strings.HasSuffix(d, " denied calls, foreign ABIs killed") {
		t.Errorf("Describe() = %q", d)
	}
	t.Logf("%s (%d instructions); %s (%d instructions)", d, len(strict.Instructions),
		light.Describe(), len(light.Instructions))
	if _, err := Build("lax"); err == nil {
		t.Error(`Build("lax") succeeded, want an error`)
	}
}

func TestNoDuplicateRules(t *testing.T) {
	seen := map[uintptr]bool{}
	for _, list := range [][]uintptr{epermCalls, debugCalls, enosysCalls} {
		for _, nr := range list {
			if seen[nr] {
				t.Errorf("syscall %d listed twice", nr)
			}
			seen[nr] = true
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	if _, err := Build(ProfileStrict); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Build(ProfileStrict); err != nil {
			b.Fatal(err)
		}
	}
}

// TestGuards: NoSetID refuses exactly the set-uid/set-gid modes (chmod
// family, creating opens, mknod) and ProtectID exactly the set*id calls
// naming the protected id; without guards all of them pass, and the
// profile's own decisions stay.
func TestGuards(t *testing.T) {
	const agent = 65532
	cases := []struct {
		name  string
		nr    uintptr
		args  []uint64
		guard uint32 // with the guards; retAllow without
	}{
		{"chmod_0755", unix.SYS_CHMOD, []uint64{0, 0o755}, retAllow},
		{"chmod_4755", unix.SYS_CHMOD, []uint64{0, 0o4755}, retEPERM},
		{"chmod_2755", unix.SYS_CHMOD, []uint64{0, 0o2755}, retEPERM},
		{"chmod_1777", unix.SYS_CHMOD, []uint64{0, 0o1777}, retAllow},
		{"fchmod_4000", unix.SYS_FCHMOD, []uint64{3, 0o4000}, retEPERM},
		{"fchmod_0644", unix.SYS_FCHMOD, []uint64{3, 0o644}, retAllow},
		{"fchmodat_6755", unix.SYS_FCHMODAT, []uint64{unix.AT_FDCWD & 0xffffffff, 0, 0o6755}, retEPERM},
		{"fchmodat_0700", unix.SYS_FCHMODAT, []uint64{3, 0, 0o700}, retAllow},
		{"fchmodat2_2000", unix.SYS_FCHMODAT2, []uint64{3, 0, 0o2000, 0}, retEPERM},
		{"creat_4755", unix.SYS_CREAT, []uint64{0, 0o4755}, retEPERM},
		{"creat_0644", unix.SYS_CREAT, []uint64{0, 0o644}, retAllow},
		{"open_creat_4755", unix.SYS_OPEN, []uint64{0, unix.O_CREAT | unix.O_WRONLY, 0o4755}, retEPERM},
		{"open_creat_0644", unix.SYS_OPEN, []uint64{0, unix.O_CREAT | unix.O_WRONLY, 0o644}, retAllow},
		{"open_rdonly_junk_mode", unix.SYS_OPEN, []uint64{0, unix.O_RDONLY, 0o4755}, retAllow},
		{"openat_creat_2755", unix.SYS_OPENAT, []uint64{3, 0, unix.O_CREAT | unix.O_RDWR, 0o2755}, retEPERM},
		{"openat_tmpfile_4755", unix.SYS_OPENAT, []uint64{3, 0, unix.O_TMPFILE | unix.O_RDWR, 0o4755}, retEPERM},
		{"openat_creat_0600", unix.SYS_OPENAT, []uint64{3, 0, unix.O_CREAT | unix.O_RDWR, 0o600}, retAllow},
		{"openat_plain", unix.SYS_OPENAT, []uint64{3, 0, unix.O_RDONLY, 0}, retAllow},
		{"openat2", unix.SYS_OPENAT2, nil, retENOSYS},
		{"mknod_reg_4755", unix.SYS_MKNOD, []uint64{0, unix.S_IFREG | 0o4755, 0}, retEPERM},
		{"mknodat_fifo", unix.SYS_MKNODAT, []uint64{3, 0, unix.S_IFIFO | 0o644, 0}, retAllow},
		{"mknodat_reg_2755", unix.SYS_MKNODAT, []uint64{3, 0, unix.S_IFREG | 0o2755, 0}, retEPERM},
		{"setuid_agent", unix.SYS_SETUID, []uint64{agent}, retEPERM},
		{"setuid_agent_high", unix.SYS_SETUID, []uint64{1<<32 | agent}, retEPERM},
		{"setuid_100", unix.SYS_SETUID, []uint64{100}, retAllow},
		{"setgid_agent", unix.SYS_SETGID, []uint64{agent}, retEPERM},
		{"setresuid_saved_agent", unix.SYS_SETRESUID, []uint64{0xffffffff, 0xffffffff, agent}, retEPERM},
		{"setresuid_0", unix.SYS_SETRESUID, []uint64{0, 0, 0}, retAllow},
		{"setreuid_eff_agent", unix.SYS_SETREUID, []uint64{0xffffffff, agent}, retEPERM},
		{"setregid_real_agent", unix.SYS_SETREGID, []uint64{agent, 0xffffffff}, retEPERM},
		{"setresgid_agent", unix.SYS_SETRESGID, []uint64{agent, 1, 1}, retEPERM},
		{"setfsuid_agent", unix.SYS_SETFSUID, []uint64{agent}, retEPERM},
		{"setfsgid_agent", unix.SYS_SETFSGID, []uint64{agent}, retEPERM},
		{"setfsuid_query", unix.SYS_SETFSUID, []uint64{0xffffffff}, retAllow},
	}
	for _, profile := range []string{ProfileStrict, ProfileLight} {
		plain := newEvaluator(t, profile)
		guarded := guardedEvaluator(t, profile, Guards{NoSetID: true, ProtectID: agent})
		for _, c := range cases {
			if got := plain.call(c.nr, c.args...); got != retAllow {
				t.Errorf("%s %s without guards: filter returned %#x, want allow", profile, c.name, got)
			}
			if got := guarded.call(c.nr, c.args...); got != c.guard {
				t.Errorf("%s %s with guards: filter returned %#x, want %#x", profile, c.name, got, c.guard)
			}
		}
		for _, c := range commonCases() {
			if got := guarded.call(c.nr, c.args...); got != c.want {
				t.Errorf("%s %s with guards: filter returned %#x, want %#x", profile, c.name, got, c.want)
			}
		}
	}
	f, err := BuildWith("", Guards{NoSetID: true})
	if err != nil || !strings.Contains(f.Describe(), "set-uid/set-gid modes refused") {
		t.Errorf("Describe of a guarded filter: %v %v", f, err)
	}
	if _, err := BuildWith("nope", Guards{NoSetID: true}); err == nil {
		t.Error("BuildWith accepted an unknown profile")
	}
}
