package e2b

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/imagestore"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// TestTemplateBuildWithSDK drives E2B's Template builder (the real e2b
// SDK): fromTemplate, copy of a directory (uploaded), setEnvs, runCmd,
// setWorkdir, a name, build logs; then Sandbox.create(name) runs on the
// built image. Another key cannot use the template. Hostile uploads (a
// path outside the context, a symlink) are refused and leave nothing, and
// an upload URL without its signature is a 401.
func TestTemplateBuildWithSDK(t *testing.T) {
	jsDir := e2bSDKDir(t)
	st := it.Template(t, "sdk-base", map[string]string{"bash": "#!/bin/sh\nexec /bin/sh \"$@\"\n"}, "COPY bash /bin/")
	if _, err := st.Publish("sdk-base", true); err != nil {
		t.Fatal(err)
	}
	for _, runtime := range []policy.Runtime{policy.RuntimeNative, policy.RuntimeGVisor} {
		t.Run(string(runtime), func(t *testing.T) {
			if tr, err := tier.Lookup(runtime); err != nil || tr.Available() != nil {
				t.Skipf("runtime %s is not available here", runtime)
			}
			templateBuildWithSDK(t, jsDir, st, runtime)
		})
	}
}

// templateBuildWithSDK is TestTemplateBuildWithSDK on a server whose
// default runtime (that of the sandboxes and of the build's RUN steps) is
// runtime.
func templateBuildWithSDK(t *testing.T, jsDir string, st *imagestore.Store, runtime policy.Runtime) {
	e := newEnvSetup(t, true, envSetup{images: st, runtime: runtime})
	ctxDir := t.TempDir()
	os.MkdirAll(filepath.Join(ctxDir, "app", "sub"), 0o755)
	os.WriteFile(filepath.Join(ctxDir, "app", "hello.txt"), []byte("hello from the context\n"), 0o644)
	os.WriteFile(filepath.Join(ctxDir, "app", "sub", "deep.txt"), []byte("deep\n"), 0o644)

	script := `
import { Template, Sandbox } from 'e2b'
const out = { logs: [] }
const t = Template({ fileContextPath: process.env.CTX })
  .fromTemplate('sdk-base')
  .copy('app', '/opt/app')
  .setEnvs({ GREETING: 'hi "there"' })
  .runCmd('echo built > /opt/built.txt; echo ' + process.env.RT + ' > /opt/rt.txt')
  .setWorkdir('/opt/app')
const info = await Template.build(t, 'sdk-built', { onBuildLogs: (l) => out.logs.push(l.message) })
out.name = info.name
const sbx = await Sandbox.create('sdk-built')
out.run = (await sbx.commands.run('cat /opt/app/hello.txt /opt/app/sub/deep.txt /opt/built.txt /opt/rt.txt; echo "$GREETING"; pwd')).stdout
await sbx.kill()
out.exists = await Template.exists('sdk-built')
try { await Sandbox.create('sdk-built', { apiKey: process.env.OTHER }); out.other = 'no error' } catch (e) { out.other = e.name + ': ' + e.message }
await Template.build(Template().fromTemplate('sdk-base').setStartCmd('echo up > /tmp/started; exec sleep 600', 'test -f /tmp/started'), 'sdk-started')
const started = await Sandbox.create('sdk-started')
out.start = (await started.commands.run('cat /tmp/started; ps -o args | grep -c "[s]leep 600"')).stdout
await started.kill()
console.log(JSON.stringify(out))
process.exit(0)
`
	cmd := exec.Command("node", "--input-type=module", "-e", script)
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+e.url, "E2B_SANDBOX_URL="+e.url, "E2B_API_KEY="+e.key, "OTHER="+e.other, "CTX="+ctxDir, "RT="+string(runtime))
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, b)
	}
	var out struct {
		Logs                    []string
		Name, Run, Other, Start string
		Exists                  bool
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("node output %q: %v", b, err)
	}
	t.Logf("%+v", out)
	if out.Run != "hello from the context\ndeep\nbuilt\n"+string(runtime)+"\nhi \"there\"\n/opt/app\n" || !out.Exists {
		t.Errorf("sandbox from the SDK-built template: %+v", out)
	}
	if !strings.Contains(strings.Join(out.Logs, "\n"), "RUN") {
		t.Errorf("build logs carry no step: %q", out.Logs)
	}
	if !strings.Contains(out.Other, "404") {
		t.Errorf("another key created from the template: %q", out.Other)
	}
	if out.Start != "up\n1\n" {
		t.Errorf("setStartCmd/setReadyCmd: the sandbox has %q, want the ready file and the start command running", out.Start)
	}

	// Hostile uploads.
	var req struct{ TemplateID, BuildID string }
	e.api(t, "POST", "/v3/templates", e.key, `{"name":"hostile"}`).json(t, &req)
	var link struct{ URL string }
	hash := strings.Repeat("ab", 32)
	e.api(t, "GET", "/templates/"+req.TemplateID+"/files/"+hash, e.key, "").json(t, &link)
	e.api(t, "GET", "/templates/"+req.TemplateID+"/files/"+hash, e.other, "").apiErr(t, 404)
	put := func(url string, entries ...*tar.Header) int {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		tw.Close()
		r := e.do(t, "PUT", strings.TrimPrefix(url, e.url), nil, buf.Bytes())
		return r.status
	}
	for what, hdr := range map[string]*tar.Header{
		"outside":  {Name: "../escape.txt", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644},
		"absolute": {Name: "/etc/evil", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644},
		"symlink":  {Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/etc", Mode: 0o777},
		"hardlink": {Name: "hard", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"},
	} {
		if st := put(link.URL, hdr); st != 400 {
			t.Errorf("%s: status %d, want 400", what, st)
		}
	}
	if st := put(strings.Replace(link.URL, "token=", "token=x", 1), &tar.Header{Name: "a.txt", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}); st != 401 {
		t.Errorf("a tampered upload URL: %d, want 401", st)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(e.h.m.Images().Dir()), "escape.txt")); err == nil {
		t.Error("a hostile upload wrote outside its context")
	}
}
