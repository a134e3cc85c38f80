package e2b

import (
	"path"
	"strings"
	"unicode/utf8"
)

// E2B's sandboxes have a user "user" whose home and working directory is
// /home/user; airlock's sandbox user "user" lives in /workspace. Paths are
// translated at this boundary, both ways, so that E2B code addressing
// /home/user/... (or relative paths, which both resolve against the home)
// reaches the workspace, and paths airlock reports come back under
// /home/user.

const (
	// E2BHome is the home and working directory E2B code expects.
	E2BHome = "/home/user"
	// sandboxHome is where it is inside an airlock sandbox.
	sandboxHome = "/workspace"
	// maxPathLen bounds a path in a request.
	maxPathLen = 4096
)

// fileRoots are the sandbox directories the E2B file operations may
// address, as for airlock's own file API: the workspace and /tmp. The agent
// performs every operation inside the sandbox, so this is the API's
// contract, not its security boundary.
var fileRoots = []string{sandboxHome, "/tmp"}

// toSandbox maps an E2B path to the sandbox path it names: "~" and
// relative paths are relative to the home, /home/user is the workspace.
// The result is absolute and clean. ok is false for a path that is too
// long, not UTF-8, or contains a NUL byte.
func toSandbox(p string) (string, bool) {
	if len(p) > maxPathLen || strings.IndexByte(p, 0) >= 0 || !utf8.ValidString(p) {
		return "", false
	}
	switch {
	case p == "" || p == "~":
		return sandboxHome, true
	case strings.HasPrefix(p, "~/"):
		p = p[2:]
	}
	if !path.IsAbs(p) {
		p = sandboxHome + "/" + p
	}
	p = path.Clean(p)
	if p == E2BHome {
		return sandboxHome, true
	}
	if strings.HasPrefix(p, E2BHome+"/") {
		return sandboxHome + p[len(E2BHome):], true
	}
	return p, true
}

// fileTarget maps an E2B path for a file operation and checks that it is
// inside the workspace or /tmp.
func fileTarget(p string) (string, *Error) {
	if p == "" {
		return "", errorf(CodeInvalidArgument, "missing path")
	}
	sp, ok := toSandbox(p)
	if !ok {
		return "", errorf(CodeInvalidArgument, "path is too long, not UTF-8 or contains a NUL byte")
	}
	for _, r := range fileRoots {
		if sp == r || strings.HasPrefix(sp, r+"/") {
			return sp, nil
		}
	}
	return "", errorf(CodeInvalidArgument, "path %q is outside %s and /tmp, the directories airlock's file API serves", p, E2BHome)
}

// fromSandbox maps a sandbox path back to what E2B code expects.
func fromSandbox(p string) string {
	if p == sandboxHome {
		return E2BHome
	}
	if strings.HasPrefix(p, sandboxHome+"/") {
		return E2BHome + p[len(sandboxHome):]
	}
	return p
}

// workDir maps an E2B working directory (a command's or a code context's;
// "" is the home) to the one the process starts in, given where E2B's
// home is in the sandbox (boxState.homeDir). Where /home/user is a
// directory, the workspace mounted a second time (runtime/native, and the
// gVisor agent), a process started there is in /home/user by getcwd(2), as
// E2B code expects: the directory is named under /home/user. Elsewhere it
// is named under the workspace.
func workDir(home, p string) (string, bool) {
	sp, ok := toSandbox(p)
	if !ok || home != E2BHome {
		return sp, ok
	}
	return fromSandbox(sp), true
}
