package e2b

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/agent"
)

// TestSymlinkTypeForOlderSDKs lists a directory holding symlinks to a
// file, to a directory, a dangling one and a chain, as the Python SDK 2.34
// (which cannot decode FILE_TYPE_SYMLINK), as 2.35 and as a client that
// does not say: the older SDK gets the type of what each link points to
// (as envd gave it before FILE_TYPE_SYMLINK) with the target still named;
// the others FILE_TYPE_SYMLINK.
func TestSymlinkTypeForOlderSDKs(t *testing.T) {
	e := newEnv(t, true)
	var created sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base"}`).json(t, &created)
	id := created.SandboxID
	sb, err := e.m.Lookup(e.h.mustOwner(t, id), id)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sb.Agent().Exec(context.Background(), agent.ExecRequest{Shell: "mkdir -p /workspace/l/d && echo x > /workspace/l/f && cd /workspace/l && ln -s f tofile && ln -s /workspace/l/d todir && ln -s nowhere dangling && ln -s tofile chain"})
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, _, st, err := p.Collect(context.Background(), 4096); err != nil || st.Code != 0 {
		t.Fatalf("making the links: %v %+v %s", err, st, stderr)
	}

	list := func(ua string) map[string]string {
		hdr := map[string]string{}
		if ua != "" {
			hdr["User-Agent"] = ua
		}
		r := e.rpc(t, id, "filesystem.Filesystem/ListDir", `{"path":"/home/user/l"}`, hdr)
		var out struct {
			Entries []struct {
				Name, Type, SymlinkTarget string
			}
		}
		r.json(t, &out)
		got := map[string]string{}
		for _, en := range out.Entries {
			got[en.Name] = en.Type + " " + en.SymlinkTarget
		}
		return got
	}
	old := list("e2b-python-sdk/2.34.0")
	want := map[string]string{
		"f": "FILE_TYPE_FILE ", "d": "FILE_TYPE_DIRECTORY ",
		"tofile": "FILE_TYPE_FILE /home/user/l/f", "todir": "FILE_TYPE_DIRECTORY /home/user/l/d",
		"dangling": " /home/user/l/nowhere" /* FILE_TYPE_UNSPECIFIED, omitted as proto3 JSON omits zero values */, "chain": "FILE_TYPE_FILE /home/user/l/tofile",
	}
	if b, w := js(old), js(want); b != w {
		t.Errorf("python 2.34:\n got %s\nwant %s", b, w)
	}
	for _, ua := range []string{"e2b-python-sdk/2.35.0", "e2b-js-sdk/2.51.0", ""} {
		got := list(ua)
		for _, n := range []string{"tofile", "todir", "dangling", "chain"} {
			if !strings.HasPrefix(got[n], "FILE_TYPE_SYMLINK /home/user/l/") {
				t.Errorf("%q: %s is %q, want FILE_TYPE_SYMLINK", ua, n, got[n])
			}
		}
	}
	// Stat too.
	r := e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"/home/user/l/todir"}`, map[string]string{"User-Agent": "e2b-python-sdk/2.34.0"})
	if !strings.Contains(string(r.body), `"FILE_TYPE_DIRECTORY"`) {
		t.Errorf("stat as 2.34: %s", r.body)
	}
}

// js is m as sorted JSON, for comparing maps in messages.
func js(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		v, _ := json.Marshal(m[k])
		b.WriteString(k + "=" + string(v) + " ")
	}
	return b.String()
}
