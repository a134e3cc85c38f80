// Package version says which airlock this binary is: its release version,
// the commit it was built from and when that commit was made.
//
// A release build sets all three at link time (scripts/release.sh:
// -ldflags "-X github.com/airlock-dev/airlock/internal/version.version=V -X ...commit=C -X
// ...date=D"). A build from a git checkout with -buildvcs=true (the
// README's command) gets the commit, its time and whether the tree was
// modified from the Go toolchain's VCS stamp (debug.ReadBuildInfo).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time by release builds; see the package comment.
var (
	version = "0.1.0-dev"
	commit  string
	date    string
)

// Info describes a build. Fields that cannot be known are "" (Commit and
// Date without a VCS stamp or release flags).
type Info struct {
	Version string `json:"version"`
	// Commit is the full VCS revision.
	Commit string `json:"commit,omitempty"`
	// Date is the commit's time (RFC 3339, UTC) for a VCS-stamped build,
	// or what the release build passed.
	Date string `json:"build_date,omitempty"`
	// Modified is true when the tree had uncommitted changes.
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

// Get returns this binary's Info.
func Get() Info {
	in := Info{Version: version, Commit: commit, Date: date,
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return in
	}
	fromBuildInfo(&in, bi)
	return in
}

// fromBuildInfo fills what the link-time flags left empty from the
// toolchain's VCS settings.
func fromBuildInfo(in *Info, bi *debug.BuildInfo) {
	set := map[string]string{}
	for _, s := range bi.Settings {
		set[s.Key] = s.Value
	}
	if in.Commit == "" && set["vcs.revision"] != "" {
		in.Commit = set["vcs.revision"]
		in.Modified = set["vcs.modified"] == "true"
		if in.Date == "" {
			in.Date = set["vcs.time"]
		}
	}
	if bi.GoVersion != "" {
		in.GoVersion = bi.GoVersion
	}
}

// String is the one line `airlock version` prints, e.g.
// "airlock 0.2.0 (commit 1a2b3c4d5e6f, 2026-11-28T03:00:00Z, go1.26.8 linux/amd64)".
func (in Info) String() string {
	s := "airlock " + in.Version
	c := in.Commit
	if c == "" {
		c = "unknown"
	} else if len(c) > 12 {
		c = c[:12]
	}
	if in.Modified {
		c += "+modified"
	}
	s += fmt.Sprintf(" (commit %s", c)
	if in.Date != "" {
		s += ", " + in.Date
	}
	return s + ", " + in.GoVersion + " " + in.Platform + ")"
}
