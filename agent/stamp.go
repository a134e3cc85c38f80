package agent

import (
	"runtime/debug"
	"strings"
)

// stampOverride, when set at link time (-ldflags "-X
// github.com/airlock-dev/airlock/agent.stampOverride=ID"), is the BuildStamp of a build whose
// source identity its builder vouches for (a release, or a test that
// builds both binaries at once).
var stampOverride string

// BuildStamp identifies the source an airlock binary was built from, so
// that a server can tell whether a separately built agent binary
// (cmd/airlock-agent) matches it: the Go version, the target, the main
// module's version and its VCS revision. It is "" when that cannot be
// known: a build without VCS information (outside a git checkout, or
// -buildvcs=false) or from a modified tree (two builds of the same
// modified tree may differ), unless stampOverride is set.
func BuildStamp() string {
	if stampOverride != "" {
		return "override:" + stampOverride
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	set := map[string]string{}
	for _, s := range bi.Settings {
		set[s.Key] = s.Value
	}
	if set["vcs.revision"] == "" || set["vcs.modified"] != "false" {
		return ""
	}
	return strings.Join([]string{bi.GoVersion, set["GOOS"], set["GOARCH"], set["CGO_ENABLED"],
		bi.Main.Path, bi.Main.Version, set["vcs"], set["vcs.revision"]}, " ")
}

// StampArg is the argument on which an agent binary prints its
// BuildStamp and exits.
const StampArg = "__agent-stamp"
