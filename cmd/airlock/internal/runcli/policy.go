package runcli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/policy"
)

// PolicyFlags are the flags shared by every command that builds a policy.
type PolicyFlags struct {
	profile, memory, disk, timeout, workdir, workspace, output string
	cpus                                                       OptFloat
	pids                                                       OptInt
	mounts, env                                                ListFlag
	// AllowDegraded is --allow-degraded.
	AllowDegraded bool
	// TTY is -t (-it, -ti).
	TTY TTYFlag
}

// Env is what --env (-e) gave, KEY=VALUE each.
func (f *PolicyFlags) Env() []string { return f.env }

// Register adds the flags to fs.
func (f *PolicyFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.profile, "profile", "strict", "policy preset: strict, standard or light (docs/SECURITY.md has a table of what each sets)")
	fs.StringVar(&f.memory, "memory", "", "memory limit, e.g. 256M, 1G "+LimitDefault("memory"))
	fs.StringVar(&f.disk, "disk", "", "size of /workspace and /tmp (each), e.g. 64M "+LimitDefault("disk"))
	fs.StringVar(&f.output, "output-limit", "", "stdout+stderr bytes before the run is stopped, e.g. 1M "+LimitDefault("output"))
	fs.Var(&f.cpus, "cpus", "CPU quota in cores, e.g. 0.5 "+LimitDefault("cpus"))
	fs.Var(&f.pids, "pids", "maximum number of processes "+LimitDefault("pids"))
	fs.StringVar(&f.timeout, "timeout", "", "wall-clock limit, e.g. 10s, 2m "+LimitDefault("timeout"))
	fs.Var(&f.mounts, "mount", "bind a host path: SRC:DST[:ro|rw] (repeatable; read-only by default)")
	fs.StringVar(&f.workdir, "workdir", "", "working directory inside the sandbox (default /workspace)")
	fs.Var(&f.env, "env", "environment variable KEY=VALUE (repeatable; nothing is inherited from the host)")
	fs.StringVar(&f.workspace, "workspace", "", "host directory to bind read-write at /workspace (default: a fresh tmpfs)")
	f.registerDockerFlags(fs)
	fs.BoolVar(&f.AllowDegraded, "allow-degraded", true, "run even when cgroups are unavailable to this user (limits fall back to rlimits; a warning is printed and the result says so); --allow-degraded=false refuses instead")
}

// Policy turns the flags into a validated policy.
func (f *PolicyFlags) Policy() (policy.Policy, error) {
	p, err := policy.Preset(policy.Profile(f.profile))
	if err != nil {
		return p, err
	}
	if err := errors.Join(SizeArg("memory", f.memory, &p.Limits.MemoryBytes), SizeArg("disk", f.disk, &p.Limits.DiskBytes),
		SizeArg("output-limit", f.output, &p.Limits.OutputBytes)); err != nil {
		return p, err
	}
	if f.cpus.set {
		p.Limits.CPUs = f.cpus.v
	}
	if f.pids.set {
		p.Limits.Pids = f.pids.v
	}
	if f.timeout != "" {
		d, err := time.ParseDuration(f.timeout)
		if err != nil {
			if n, err2 := strconv.ParseFloat(f.timeout, 64); err2 == nil {
				d = time.Duration(n * float64(time.Second))
			} else {
				return p, fmt.Errorf("--timeout: bad duration %q (want e.g. 10s, 2m)", f.timeout)
			}
		}
		p.Limits.WallTime = d
	}
	for _, m := range f.mounts {
		parts := strings.Split(m, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return p, fmt.Errorf("--mount %q: want SRC:DST[:ro|rw]", m)
		}
		mnt := policy.Mount{Source: parts[0], Target: parts[1]}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
			case "rw":
				mnt.Writable = true
			default:
				return p, fmt.Errorf("--mount %q: mode must be ro or rw", m)
			}
		}
		abs, err := filepath.Abs(mnt.Source)
		if err != nil {
			return p, fmt.Errorf("--mount %q: %w", m, err)
		}
		mnt.Source = abs
		if _, err := os.Stat(abs); err != nil {
			return p, fmt.Errorf("--mount %q: source does not exist: %s", m, abs)
		}
		p.Filesystem.Mounts = append(p.Filesystem.Mounts, mnt)
	}
	for _, kv := range f.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return p, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		p.SetEnv(k, v)
	}
	if f.workdir != "" {
		p.Filesystem.Workdir = f.workdir
	}
	if f.workspace != "" {
		abs, err := filepath.Abs(f.workspace)
		if err != nil {
			return p, fmt.Errorf("--workspace: %w", err)
		}
		p.Filesystem.Workspace = abs
	}
	if err := CheckHostCeilings(p.Limits); err != nil {
		return p, err
	}
	return p, p.Validate()
}

// SizeArg parses flag --name's size v into *dst, leaving it alone when v
// is empty (the profile's value stays).
func SizeArg(name, v string, dst *int64) error {
	if v == "" {
		return nil
	}
	n, err := policy.ParseSize(v)
	if err != nil {
		return fmt.Errorf("--%s: %w", name, err)
	}
	*dst = n
	return nil
}

// CheckHostCeilings refuses limits this host cannot honour (or that are
// not positive), naming the flag's field and the host's ceiling.
func CheckHostCeilings(l policy.Limits) error {
	h, err := policy.HostCeilings()
	if err != nil {
		return err
	}
	return h.Check(l, "this host")
}
