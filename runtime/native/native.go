// Package native is airlock's embedded runtime: Linux namespaces,
// pivot_root onto a minimal root, seccomp-bpf, Landlock, cgroups, rlimits
// and dropped capabilities, set up by a raw-syscall child between clone and
// execve so that a sandbox costs no second Go runtime start.
//
// One file per kernel concern: forkexec (the child), mount (the root tree),
// userns (uid maps), landlock, rlimit, caps; cgroups and seccomp are
// sub-packages.
package native

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime"
)

// Config describes one sandbox to start.
type Config struct {
	// ID names the sandbox (its cgroup, its log lines). Empty means a random id.
	ID string
	// Policy is what the sandbox may do. It must validate.
	Policy policy.Policy
	// Args is the program and its arguments. A name without a slash is looked
	// up in the sandbox's PATH.
	Args []string
	// Stdin, Stdout and Stderr become fds 0-2 inside; nil means /dev/null.
	Stdin, Stdout, Stderr *os.File
	// ControllingTerminal makes Stdin, a terminal, the program's
	// controlling terminal (TIOCSCTTY in its new session), for job control
	// and Ctrl-C. Give it only the slave of a fresh pseudo-terminal pair,
	// never the caller's own terminal (TIOCSTI would type into it).
	ControllingTerminal bool
	// AgentBinary, if set, is a host file bound read-only at AgentPath inside
	// (the airlock binary itself, for the in-sandbox agent).
	AgentBinary string
	// AllowDegraded lets the sandbox start when cgroups are unavailable
	// (resource limits then fall back to rlimits and the run says so).
	AllowDegraded bool
	// SurviveParent keeps the sandbox alive if the launching process dies
	// (a server that restarts and reattaches). By default the sandbox is
	// killed with its launcher.
	SurviveParent bool
	// Listen lists TCP addresses (e.g. "127.0.0.1:3128") to open inside the
	// sandbox's network namespace before the program starts. The listeners
	// belong to the caller (Sandbox.Listeners), which serves them from the
	// host: the egress proxy uses this.
	Listen []string
	// Agent runs the program (the in-sandbox agent) as AgentUID with
	// AgentCaps instead of as the policy's user, when airlock is root (with
	// one uid mapped, unprivileged, the agent shares the workload's uid).
	// The agent starts workload processes as the policy's user.
	Agent bool
	// HostIDBase is the first host uid and gid of the range (idrange.Size
	// ids) that sandbox ids 0-65535 map to, leased by the caller for the
	// sandbox's life. Zero: Start leases a free range itself and frees it
	// once Wait has returned. Ignored when airlock is not root (the
	// caller's own uid is then the only id mapped).
	HostIDBase int
	// Image, if set, makes the root an overlay of an image's layers with a
	// per-sandbox upper directory on disk (writable anywhere) instead of
	// the read-only host-derived root; root only.
	Image *ImageRoot
	// Volumes are mounted read-write through ID-mapped mounts, so that
	// every sandbox sees a volume's files with the same owners; root only.
	Volumes []VolumeMount
}

// AgentUID is the uid and gid inside the sandbox that the in-sandbox agent
// runs as when Config.Agent is set, distinct from any workload user: the
// workload can then neither signal, trace, read nor prlimit the agent.
// With a root workload (policy.User.Root), whose CAP_SETGID could name any
// group in setgroups, the agent's gid is the workload's own instead.
const AgentUID = 65532

// AgentCaps are the only capabilities the agent keeps (inside the sandbox's
// user namespace, as ambient capabilities): enough to start workload
// processes as the policy's user (setuid, setgid), to signal them (kill),
// and to empty its own bounding set at start (setpcap), which it then drops.
// Workload processes end with none.
var AgentCaps = []int{unix.CAP_KILL, unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETPCAP}

// RootCaps are the capabilities of a policy.User.Root workload, inside
// the sandbox's user namespace only (they act on files and ids that
// namespace maps, never on the host's): what dpkg, apt, pip and chown need.
// Not among them: kill (the agent, PID 1, must stay out of reach), fsetid
// (a written set-uid file keeps losing its bit), setfcap, setpcap, mknod,
// sys_admin and the rest. They reach the workload as ambient capabilities;
// uid 0 alone gives nothing (securebits noroot stays locked), and a
// process that switches to another uid loses them as on any Linux system.
var RootCaps = []int{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER,
	unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_NET_BIND_SERVICE}

// AgentPath is where AgentBinary appears inside the sandbox.
const AgentPath = "/.airlock/airlock"

// SetupError is a failure to build the sandbox, as opposed to a failure of
// the program inside it.
type SetupError struct {
	Step string // what was being done, e.g. "mount /usr"
	Err  error
}

func (e *SetupError) Error() string { return fmt.Sprintf("sandbox setup: %s: %v", e.Step, e.Err) }
func (e *SetupError) Unwrap() error { return e.Err }

// ErrNotFound is returned (wrapped) when the command does not exist inside
// the sandbox; ErrNotExecutable when it exists but cannot be executed.
var (
	ErrNotFound      = errors.New("command not found in sandbox")
	ErrNotExecutable = errors.New("command not executable in sandbox")
)

// Status is how a run ended.
type Status string

// Run statuses.
const (
	StatusOK          Status = "ok"
	StatusNonzeroExit Status = "nonzero_exit"
	StatusTimeout     Status = "timeout"
	StatusOOM         Status = "oom"
	StatusOutputLimit Status = "output_limit"
	StatusKilled      Status = "killed"
	StatusSetupError  Status = "setup_error"
)

// Result is the outcome of a one-shot run.
type Result struct {
	Status          Status           `json:"status"`
	ExitCode        int              `json:"exit_code"`
	Signal          string           `json:"signal"`
	Stdout          string           `json:"stdout"`
	Stderr          string           `json:"stderr"`
	Truncated       bool             `json:"truncated"`
	WallMS          float64          `json:"wall_ms"`
	CPUMS           float64          `json:"cpu_ms"`
	PeakMemoryBytes int64            `json:"peak_memory_bytes"`
	Enforced        runtime.Enforced `json:"enforced"`
	Error           string           `json:"error,omitempty"`
	// Wall is WallMS as a duration, for Go callers.
	Wall time.Duration `json:"-"`
}

// RootCapsArg is RootCaps as the agent's --root-caps value ("0,1,...").
func RootCapsArg() string {
	s := make([]string, len(RootCaps))
	for i, c := range RootCaps {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}
