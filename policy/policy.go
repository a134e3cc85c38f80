// Package policy defines what a sandbox may do: its filesystem, resource
// limits, network, environment, user and system-call profile. A Policy is
// runtime-neutral; each runtime translates it and reports what it enforced.
package policy

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
)

// Profile names a preset. Strict is the default.
type Profile string

// The presets. Strict denies the most and is the default; light allows more
// system calls and larger limits for trusted-but-buggy code.
const (
	Strict   Profile = "strict"
	Standard Profile = "standard"
	Light    Profile = "light"
)

// Policy is everything a sandbox is allowed. The zero value is not valid; start
// from Preset and adjust.
type Policy struct {
	// Profile is the preset this policy was derived from; it also selects the
	// seccomp profile.
	Profile Profile `json:"profile"`
	// Filesystem describes the sandbox's root tree.
	Filesystem Filesystem `json:"filesystem"`
	// Limits bounds the resources the sandbox may use.
	Limits Limits `json:"limits"`
	// Network says what the sandbox may reach.
	Network Network `json:"network"`
	// Env is the complete environment of the sandboxed program, as KEY=VALUE.
	// Nothing is inherited from the host.
	Env []string `json:"env"`
	// User is the identity inside the sandbox.
	User User `json:"user"`
	// Runtime is the isolation tier that enforces this policy: native (the
	// default; empty means native) or gvisor.
	Runtime Runtime `json:"runtime,omitempty"`
}

// Runtime names an isolation tier.
type Runtime string

// The runtimes. Native shares the host kernel behind namespaces, seccomp,
// Landlock and cgroups; GVisor puts gVisor's user-space kernel (runsc)
// between the program and the host kernel.
const (
	RuntimeNative Runtime = "native"
	RuntimeGVisor Runtime = "gvisor"
	// RuntimeWasm runs a WebAssembly (WASI preview 1) module in wazero
	// inside the airlock process: no kernel boundary, only what the host
	// functions hand the module (runtime/wasm).
	RuntimeWasm Runtime = "wasm"
	// RuntimeMicroVM runs the sandbox in a QEMU microvm guest with its own
	// kernel (runtime/microvm).
	RuntimeMicroVM Runtime = "microvm"
)

// ParseRuntime checks a runtime name; empty means native.
func ParseRuntime(s string) (Runtime, error) {
	switch Runtime(s) {
	case "", RuntimeNative:
		return RuntimeNative, nil
	case RuntimeGVisor, RuntimeWasm, RuntimeMicroVM:
		return Runtime(s), nil
	}
	return "", fmt.Errorf("runtime: unknown %q (want native, gvisor, wasm or microvm)", s)
}

// Filesystem describes the root tree of a sandbox. Host directories appear
// only through explicit read-only binds or mounts.
type Filesystem struct {
	// ReadOnly lists host paths bound read-only at the same path inside
	// (e.g. /usr, /lib). Missing paths are skipped (a host may lack /lib64).
	ReadOnly []string `json:"read_only"`
	// EtcFiles lists host files under /etc copied in read-only
	// (ld.so.cache, ssl certificates...). Missing files are skipped.
	EtcFiles []string `json:"etc_files"`
	// Mounts are extra binds requested by the user.
	Mounts []Mount `json:"mounts,omitempty"`
	// Workspace is a host directory bound read-write at /workspace. Empty
	// means a fresh size-capped tmpfs.
	Workspace string `json:"workspace,omitempty"`
	// Workdir is the working directory of the program inside the sandbox.
	Workdir string `json:"workdir"`
	// Hidden lists paths inside the sandbox that are masked (an empty
	// read-only tmpfs over a directory, /dev/null over a file).
	Hidden []string `json:"hidden,omitempty"`
}

// Mount binds a host path into the sandbox.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	Writable bool   `json:"writable"`
}

// Limits bounds a sandbox's resources. Zero means "use the preset's value";
// there is no way to ask for unlimited.
type Limits struct {
	MemoryBytes   int64         `json:"memory_bytes"`
	CPUs          float64       `json:"cpus"`
	Pids          int64         `json:"pids"`
	DiskBytes     int64         `json:"disk_bytes"`   // size of /workspace (tmpfs) and of /tmp, each
	Inodes        int64         `json:"inodes"`       // inodes of /workspace and /tmp, each
	OpenFiles     uint64        `json:"open_files"`   // RLIMIT_NOFILE
	FileSizeBytes int64         `json:"file_size"`    // RLIMIT_FSIZE
	CPUTime       time.Duration `json:"cpu_time"`     // RLIMIT_CPU
	WallTime      time.Duration `json:"wall_time"`    // whole-sandbox deadline
	OutputBytes   int64         `json:"output_bytes"` // stdout+stderr captured before the run is stopped
}

// NetworkMode is how a sandbox reaches the network.
type NetworkMode string

// Network modes. Every mode keeps the sandbox in its own empty network
// namespace; allowlist and open go through the host-side egress proxy.
const (
	NetNone      NetworkMode = "none"
	NetAllowlist NetworkMode = "allowlist"
	NetOpen      NetworkMode = "open"
)

// Network says what a sandbox may reach.
type Network struct {
	Mode  NetworkMode `json:"mode"`
	Allow []string    `json:"allow,omitempty"`
	Deny  []string    `json:"deny,omitempty"`
}

// User is the identity of the program inside the sandbox. It is always
// mapped to an unprivileged host uid.
type User struct {
	UID      int    `json:"uid"`
	GID      int    `json:"gid"`
	Name     string `json:"name"`
	Home     string `json:"home"`
	Hostname string `json:"hostname"`
	// Root makes the user (uid and gid 0) the root of the sandbox's own
	// user namespace with the capabilities a package manager needs there
	// (the native runtime's RootCaps), which act only on what that
	// namespace maps: never host root. Image roots only.
	Root bool `json:"root,omitempty"`
}

const (
	kib = 1 << 10
	mib = 1 << 20
	gib = 1 << 30
)

// AliasDir is a directory of the native sandbox root, last on the default
// PATH, with commands the host's /usr may lack under their usual names
// (python for python3).
const AliasDir = "/opt/airlock/bin"

// Preset returns the policy for a named profile. An empty name means Strict.
func Preset(name Profile) (Policy, error) {
	if name == "" {
		name = Strict
	}
	p := Policy{
		Profile: name,
		Filesystem: Filesystem{
			ReadOnly: []string{"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"},
			EtcFiles: []string{
				"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/nsswitch.conf",
				"/etc/ssl/certs/ca-certificates.crt", "/etc/alternatives", "/etc/mime.types",
				"/etc/matplotlibrc", "/etc/python3", "/etc/python3.11", "/etc/fonts", "/etc/os-release",
			},
			Workdir: "/workspace",
		},
		Network: Network{Mode: NetNone},
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin:" + AliasDir,
			"HOME=/workspace",
			"LANG=C.UTF-8",
			"TMPDIR=/tmp",
			"USER=user",
			"LOGNAME=user",
		},
		User: User{UID: 1000, GID: 1000, Name: "user", Home: "/workspace", Hostname: "sandbox"},
	}
	switch name {
	case Strict:
		p.Limits = Limits{
			MemoryBytes: 512 * mib, CPUs: 1, Pids: 128, DiskBytes: 256 * mib, Inodes: 16384,
			OpenFiles: 256, FileSizeBytes: 256 * mib, CPUTime: 5 * time.Minute,
			WallTime: 60 * time.Second, OutputBytes: 16 * mib,
		}
	case Standard:
		p.Limits = Limits{
			MemoryBytes: 2 * gib, CPUs: 2, Pids: 512, DiskBytes: 1 * gib, Inodes: 65536,
			OpenFiles: 1024, FileSizeBytes: 1 * gib, CPUTime: 30 * time.Minute,
			WallTime: 10 * time.Minute, OutputBytes: 64 * mib,
		}
	case Light:
		p.Limits = Limits{
			MemoryBytes: 4 * gib, CPUs: 2, Pids: 1024, DiskBytes: 4 * gib, Inodes: 262144,
			OpenFiles: 4096, FileSizeBytes: 4 * gib, CPUTime: time.Hour,
			WallTime: time.Hour, OutputBytes: 256 * mib,
		}
	default:
		return Policy{}, fmt.Errorf("unknown profile %q (want strict, standard or light)", name)
	}
	return p, nil
}

// Validate checks the policy and returns every problem it finds, joined.
func (p *Policy) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch p.Profile {
	case Strict, Standard, Light:
	default:
		bad("profile: unknown %q", p.Profile)
	}
	l := p.Limits
	if l.MemoryBytes < 16*mib {
		bad("limits.memory: %d bytes is below the 16 MiB minimum", l.MemoryBytes)
	}
	if l.CPUs <= 0 || l.CPUs > 1024 {
		bad("limits.cpus: %g must be in (0, 1024]", l.CPUs)
	}
	if l.Pids < 4 || l.Pids > 1<<22 {
		bad("limits.pids: %d must be in [4, 4194304]", l.Pids)
	}
	if l.DiskBytes < 1*mib {
		bad("limits.disk: %d bytes is below the 1 MiB minimum", l.DiskBytes)
	}
	if l.Inodes < 64 {
		bad("limits.inodes: %d is below the minimum of 64", l.Inodes)
	}
	if l.OpenFiles < 16 || l.OpenFiles > 1<<20 {
		bad("limits.open_files: %d must be in [16, 1048576]", l.OpenFiles)
	}
	if l.FileSizeBytes <= 0 {
		bad("limits.file_size: must be positive")
	}
	if l.CPUTime < time.Second {
		bad("limits.cpu_time: %s is below 1s", l.CPUTime)
	}
	if l.WallTime < time.Millisecond {
		bad("limits.wall_time: %s is below 1ms", l.WallTime)
	}
	if l.OutputBytes < 1 {
		bad("limits.output_bytes: must be positive")
	}
	if _, err := ParseRuntime(string(p.Runtime)); err != nil {
		errs = append(errs, err)
	}
	if p.Runtime == RuntimeWasm && p.Network.Mode != NetNone {
		bad("network.mode: %q is not available with runtime wasm (WASI preview 1 modules get no sockets)", p.Network.Mode)
	}
	switch p.Network.Mode {
	case NetNone, NetAllowlist, NetOpen:
	default:
		bad("network.mode: unknown %q (want none, allowlist or open)", p.Network.Mode)
	}
	for _, m := range p.Filesystem.Mounts {
		if !path.IsAbs(m.Source) {
			bad("mount source %q: must be an absolute path", m.Source)
		}
		if err := checkTarget(m.Target); err != nil {
			bad("mount target %q: %v", m.Target, err)
		}
	}
	for _, h := range p.Filesystem.Hidden {
		if err := checkTarget(h); err != nil {
			bad("hidden path %q: %v", h, err)
		}
	}
	if p.Filesystem.Workdir != "" && !path.IsAbs(p.Filesystem.Workdir) {
		bad("workdir %q: must be an absolute path", p.Filesystem.Workdir)
	}
	for _, kv := range p.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, "\x00") || strings.ContainsRune(kv, 0) {
			bad("env %q: want KEY=VALUE", kv)
		}
	}
	fs := &p.Filesystem
	paths := append(append(append([]string{fs.Workspace, fs.Workdir}, fs.ReadOnly...), fs.EtcFiles...), fs.Hidden...)
	for _, m := range fs.Mounts {
		paths = append(paths, m.Source, m.Target)
	}
	for _, s := range append(paths, p.User.Name, p.User.Home, p.User.Hostname) {
		if strings.IndexByte(s, 0) >= 0 {
			bad("path or name %q contains a NUL byte", s)
		}
	}
	if p.User.UID < 0 || p.User.UID > 65535 || p.User.GID < 0 || p.User.GID > 65535 {
		bad("user: uid and gid must be in [0, 65535]")
	}
	if p.User.Root && (p.User.UID != 0 || p.User.GID != 0) {
		bad("user: root means uid and gid 0")
	}
	return errors.Join(errs...)
}

// reserved are sandbox paths that the runtime builds itself and that a user
// mount may not replace.
var reserved = []string{"/", "/proc", "/dev", "/etc", "/tmp", "/workspace", "/.airlock"}

func checkTarget(t string) error {
	if !path.IsAbs(t) {
		return errors.New("must be an absolute path")
	}
	if path.Clean(t) != t {
		return errors.New("must be a clean path (no .., //, or trailing /)")
	}
	for _, r := range reserved {
		if t == r {
			return fmt.Errorf("%s is built by airlock and cannot be replaced", r)
		}
	}
	if strings.HasPrefix(t, "/proc/") || strings.HasPrefix(t, "/dev/") {
		return errors.New("cannot mount under /proc or /dev")
	}
	return nil
}

// SetEnv sets KEY=VALUE in the policy's environment, replacing an earlier value.
func (p *Policy) SetEnv(key, value string) {
	prefix := key + "="
	for i, kv := range p.Env {
		if strings.HasPrefix(kv, prefix) {
			p.Env[i] = prefix + value
			return
		}
	}
	p.Env = append(p.Env, prefix+value)
}
