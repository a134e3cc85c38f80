// Package hostcheck finds what on a host forbids the kernel features
// airlock's sandboxes need, and says how to change it: the failures users
// of namespace sandboxes report most (a container runtime's default
// seccomp or AppArmor profile, a user namespace without mapped ids,
// Ubuntu's restriction of unprivileged user namespaces, a sysctl that
// disables them, no cgroup to write as non-root).
//
// Diagnose reads only /proc and the environment: it does not try the
// features itself (airlock doctor does, by starting a sandbox), so it can
// explain a failure after the fact.
package hostcheck

import (
	"errors"
	"fmt"
	"strings"
)

// A Finding is one thing on this host that stops airlock, with its fix.
type Finding struct {
	// Problem says what it is and what it breaks.
	Problem string `json:"problem"`
	// Fix is the exact change (a command, a flag, a setting) that removes it.
	Fix string `json:"fix"`
}

// Container kinds Diagnose recognises.
const (
	Docker     = "docker"
	Podman     = "podman"
	Kubernetes = "kubernetes"
	OtherCtr   = "container"
)

// Error is a failure to start a sandbox explained by the host's findings.
type Error struct {
	Err      error
	Findings []Finding
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	b.WriteString("\nthis host forbids what airlock needs:")
	for _, f := range e.Findings {
		fmt.Fprintf(&b, "\n  - %s\n    fix: %s", f.Problem, f.Fix)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Explain returns err with what Diagnose finds on this host, or err
// unchanged when it finds nothing (or err is nil or explained already).
func Explain(err error) error {
	if err == nil {
		return nil
	}
	var he *Error
	if errors.As(err, &he) {
		return err
	}
	fs := Diagnose()
	if len(fs) == 0 {
		return err
	}
	return &Error{Err: err, Findings: fs}
}

// containerFix is how to give a container of the given kind what airlock
// needs, or "" outside one.
func containerFix(kind string) string {
	switch kind {
	case Docker:
		return "start the container with `docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined --cap-add SYS_ADMIN --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw ...` (or `--privileged`), or run airlock on the host"
	case Podman:
		return "start the container with `podman run --security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt unmask=ALL --cap-add SYS_ADMIN --cgroupns=host ...` as root (rootless Podman maps one uid range and cannot delegate cgroup v1: use rootful Podman or run airlock on the host)"
	case Kubernetes:
		return "give the airlock pod `securityContext: {privileged: true}` (or `seccompProfile: {type: Unconfined}`, `appArmorProfile: {type: Unconfined}`, `capabilities: {add: [SYS_ADMIN]}` and `procMount: Unmasked`), or let the cluster run the sandboxes as pods: `airlock serve --backend kubernetes` (docs/kubernetes.md)"
	case OtherCtr:
		return "allow the container user namespaces, mounts and its own cgroup (for LXC: `security.nesting=true`; for systemd-nspawn: `--private-users=no --capability=CAP_SYS_ADMIN`), or run airlock on the host"
	}
	return ""
}
