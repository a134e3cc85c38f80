package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
)

// Writable host directories (a :rw mount, a host workspace) follow native's
// ownership rules: gVisor's gofer gives the files the sandbox creates the
// sandbox user's own ids on the host (1000 by default), so a directory of
// another unprivileged host user U:G is served through an ID-mapped clone
// of it (native.MapHostDirs) in which U:G appear as the sandbox user and
// nothing else is mapped: the sandbox writes there without a chown, its
// files belong to U:G on the host, and it cannot give a file any other
// owner (no other id exists on that mount). The clones are attached under
// hostDirStage(id) for the sandbox's life, since every restore (resume,
// fork, adoption) has runsc's gofer bind them again; Destroy and Remove
// detach them before removing the directory.

// hostDirStage is where sandbox id's ID-mapped host directories are
// attached.
func hostDirStage(id string) string { return filepath.Join(StateBase, "hostdirs", id) }

// mapHostDirs maps p's writable host directories for sandbox id (p is
// changed to use the clones) and returns the enforced layer to add, if any.
func mapHostDirs(p *policy.Policy, id string) (*rt.Layer, error) {
	// gVisor creates a file as root, then gives it its owner.
	_, detail, err := native.MapHostDirs(p, p.User.UID, p.User.GID, 0, hostDirStage(id))
	if err != nil {
		unstageHostDirs(id)
		return nil, &native.SetupError{Step: "host directories", Err: err}
	}
	if detail == "" {
		return nil, nil
	}
	return &rt.Layer{Name: "hostdirs", State: rt.StateOK, Detail: detail + " (served by gVisor's gofer through the ID-mapped clone; the set-uid/set-gid refusal is an OCI seccomp filter enforced by the sentry)"}, nil
}

// unstageHostDirs detaches sandbox id's ID-mapped host directories and
// removes their (then empty) mount points. It never removes recursively:
// a clone still attached would lead into the user's directory.
func unstageHostDirs(id string) error {
	stage := hostDirStage(id)
	ents, err := os.ReadDir(stage)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gvisor: host directories of %s: %w", id, err)
	}
	var errs []error
	for _, e := range ents {
		at := filepath.Join(stage, e.Name())
		if err := unix.Unmount(at, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("detach %s: %w", at, err))
			continue
		}
		if err := os.Remove(at); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(stage); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("gvisor: host directories of %s: %w", id, errors.Join(errs...))
	}
	return nil
}

// noSetIDSeccomp is the OCI seccomp filter a sandbox with an ID-mapped
// host directory runs under, as native's does (seccomp.Guards.NoSetID):
// every way of giving a file a set-uid or set-gid mode (chmod, fchmod,
// fchmodat, fchmodat2, creat, mknod, mknodat, open and openat creating a
// file) answers EPERM, and openat2 ENOSYS. Without it the sandbox could
// leave a set-uid program of the directory's owner on the host. gVisor's
// sentry enforces it (runsc --oci-seccomp, which runscFlags always passes:
// without the flag runsc ignores the filter).
func noSetIDSeccomp() *specs.LinuxSeccomp {
	var rules []specs.LinuxSyscall
	mode := func(names []string, modeArg uint, flagsArg int) {
		for _, bit := range []uint64{unix.S_ISUID, unix.S_ISGID} {
			creating := []uint64{0}
			if flagsArg >= 0 {
				creating = []uint64{unix.O_CREAT, unix.O_TMPFILE &^ unix.O_DIRECTORY}
			}
			for _, c := range creating {
				args := []specs.LinuxSeccompArg{{Index: modeArg, Value: bit, ValueTwo: bit, Op: specs.OpMaskedEqual}}
				if flagsArg >= 0 {
					args = append(args, specs.LinuxSeccompArg{Index: uint(flagsArg), Value: c, ValueTwo: c, Op: specs.OpMaskedEqual})
				}
				rules = append(rules, specs.LinuxSyscall{Names: names, Action: specs.ActErrno, Args: args})
			}
		}
	}
	mode([]string{"chmod", "fchmod", "creat", "mknod"}, 1, -1)
	mode([]string{"fchmodat", "fchmodat2", "mknodat"}, 2, -1)
	mode([]string{"open"}, 2, 1)
	mode([]string{"openat"}, 3, 2)
	rules = append(rules, specs.LinuxSyscall{Names: []string{"openat2"}, Action: specs.ActErrno})
	return &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: rules}
}
