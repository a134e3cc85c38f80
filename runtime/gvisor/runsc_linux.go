package gvisor

import (
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// Runsc describes the runsc binary airlock uses.
type Runsc struct {
	// Path is the absolute path of the binary.
	Path string
	// Version is the gvisor.dev/gvisor module version it was built from
	// (runsc's own --version says VERSION_MISSING for go install builds).
	Version string
}

var findOnce struct {
	sync.Once
	r   Runsc
	err error
}

// Find locates runsc: $AIRLOCK_RUNSC, else /usr/local/bin/runsc, else
// runsc on PATH. The result is cached for the life of the process.
func Find() (Runsc, error) {
	findOnce.Do(func() { findOnce.r, findOnce.err = find() })
	return findOnce.r, findOnce.err
}

func find() (Runsc, error) {
	var path string
	if p := os.Getenv("AIRLOCK_RUNSC"); p != "" {
		path = p
	} else if _, err := os.Stat("/usr/local/bin/runsc"); err == nil {
		path = "/usr/local/bin/runsc"
	} else if p, err := exec.LookPath("runsc"); err == nil {
		path = p
	} else {
		return Runsc{}, fmt.Errorf("%w: runsc not found; %s", ErrUnavailable, InstallHint)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return Runsc{}, fmt.Errorf("%w: runsc at %s: %v; %s", ErrUnavailable, path, err, InstallHint)
	}
	if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return Runsc{}, fmt.Errorf("%w: %s is not an executable file; %s", ErrUnavailable, path, InstallHint)
	}
	r := Runsc{Path: path, Version: "unknown"}
	if bi, err := buildinfo.ReadFile(path); err == nil {
		r.Version = bi.Main.Version
		if bi.Main.Path != "gvisor.dev/gvisor" {
			return Runsc{}, fmt.Errorf("%w: %s is not a gVisor build (module %q); %s", ErrUnavailable, path, bi.Main.Path, InstallHint)
		}
		for _, s := range bi.Settings {
			if s.Key == "CGO_ENABLED" && s.Value == "1" {
				return Runsc{}, fmt.Errorf("%w: %s is a cgo build, which does not run on these hosts; %s", ErrUnavailable, path, InstallHint)
			}
			if s.Key == "-ldflags" && r.Version == "(devel)" {
				if v := ldflagsVersion(s.Value); v != "" {
					r.Version = v
				}
			}
		}
	}
	return r, nil
}

// Available reports whether sandboxes can run under gVisor here: runsc is
// present and airlock runs as root (runsc's gofer needs it).
func Available() (Runsc, error) {
	r, err := Find()
	if err != nil {
		return r, err
	}
	if os.Geteuid() != 0 {
		return r, fmt.Errorf("%w: runsc must run as root here (its rootless mode cannot start the gofer)", ErrUnavailable)
	}
	return r, nil
}

var errNoCommand = errors.New("no command given")

// ldflagsVersion returns the module version in a runsc build's -ldflags,
// as scripts/runsc-seccomp/build.sh sets it (-X
// gvisor.dev/gvisor/runsc/version.version=VERSION+airlock-seccomp.HASH:
// built from a copy of the module, whose build information says (devel)),
// without the +build suffix; "" if there is none.
func ldflagsVersion(ldflags string) string {
	_, v, ok := strings.Cut(ldflags, "gvisor.dev/gvisor/runsc/version.version=")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(v, " \t'\""); i >= 0 {
		v = v[:i]
	}
	v, _, _ = strings.Cut(v, "+")
	return v
}
