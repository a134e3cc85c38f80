package e2b

import (
	"context"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/airlock-dev/airlock/agent"
)

// Clients older than envd's FILE_TYPE_SYMLINK: the Python SDK before 2.35
// fails to decode a listing or a stat that carries it (its generated enum
// lacks the value); the JS SDK before 2.36 skips such entries. envd before
// it reported a symlink with the type of what it points to. airlock does
// the same for those clients, which name themselves in User-Agent
// ("e2b-python-sdk/2.34.0", "e2b-js-sdk/2.35.0"); everyone else gets
// FILE_TYPE_SYMLINK, as from the newest envd.

// symlinkTypeSince is the first release of each SDK that decodes
// FILE_TYPE_SYMLINK.
var symlinkTypeSince = map[string][2]int{"e2b-python-sdk": {2, 35}, "e2b-js-sdk": {2, 36}}

// legacySymlinks reports whether r comes from an SDK release that cannot
// take FILE_TYPE_SYMLINK.
func legacySymlinks(r *http.Request) bool {
	for _, part := range strings.Fields(r.Header.Get("User-Agent")) {
		name, ver, ok := strings.Cut(part, "/")
		since, known := symlinkTypeSince[name]
		if !ok || !known {
			continue
		}
		f := strings.SplitN(ver, ".", 3)
		if len(f) < 2 {
			return false
		}
		major, err1 := strconv.Atoi(f[0])
		minor, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			return false
		}
		return major < since[0] || major == since[0] && minor < since[1]
	}
	return false
}

// maxSymlinkHops bounds following a chain of symlinks.
const maxSymlinkHops = 8

// legacySymlinkType gives e, a symlink's entry, the type of what it points
// to (file or directory), following up to maxSymlinkHops links inside the
// sandbox; a dangling or looping link, or one to anything else, is
// FILE_TYPE_UNSPECIFIED. symlinkTarget stays.
func legacySymlinkType(ctx context.Context, ag *agent.Client, e *entryInfo, fi agent.FileInfo) {
	e.Type = pbFileType(fileTypeUnspecified)
	cur := fi
	for i := 0; i < maxSymlinkHops && cur.Type == agent.TypeSymlink; i++ {
		t := cur.Target
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(cur.Path), t)
		}
		next, err := ag.Stat(ctx, path.Clean(t))
		if err != nil {
			return
		}
		cur = next
	}
	switch cur.Type {
	case agent.TypeFile:
		e.Type = pbFileType(fileTypeFile)
	case agent.TypeDir:
		e.Type = pbFileType(fileTypeDirectory)
	}
}

// entriesFor is entryFor over a listing, for the client of r.
func entriesFor(ctx context.Context, r *http.Request, ag *agent.Client, list []agent.FileInfo) []entryInfo {
	legacy := legacySymlinks(r)
	out := make([]entryInfo, 0, len(list))
	for _, fi := range list {
		e := entryFor(fi)
		if legacy && fi.Type == agent.TypeSymlink {
			legacySymlinkType(ctx, ag, &e, fi)
		}
		out = append(out, e)
	}
	return out
}
