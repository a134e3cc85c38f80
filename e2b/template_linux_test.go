package e2b

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/imagestore"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// TestCreateFromTemplateWithSDK builds a template (a Dockerfile FROM a
// busybox image of a registry on 127.0.0.1, with a COPY and an ENV) into
// the server's image store, then drives the real e2b SDK:
// Sandbox.create('my-template') gets a sandbox whose commands see the
// template's file and env, and whose info names the template; a name that
// is neither a template nor an image is E2B's 404 "template ... not found".
func TestCreateFromTemplateWithSDK(t *testing.T) {
	jsDir := e2bSDKDir(t)
	// The SDKs start commands as /bin/bash -l -c CMD: the template brings
	// a bash that is busybox's sh.
	st := it.Template(t, "my-template", map[string]string{"greeting.txt": "from the template\n", "bash": "#!/bin/sh\nexec /bin/sh \"$@\"\n"},
		"ENV APP_NAME=demo", "COPY bash /bin/", "COPY greeting.txt /opt/app/")
	// Built by the operator (no owner): the test's API key sees it once
	// published, as a real deployment would (docs/images.md, "Owners").
	if _, err := st.Publish("my-template", true); err != nil {
		t.Fatal(err)
	}
	for _, runtime := range []policy.Runtime{policy.RuntimeNative, policy.RuntimeGVisor} {
		t.Run(string(runtime), func(t *testing.T) {
			if tr, err := tier.Lookup(runtime); err != nil || tr.Available() != nil {
				t.Skipf("runtime %s is not available here", runtime)
			}
			templateWithSDK(t, jsDir, st, runtime)
		})
	}
}

// templateWithSDK creates a sandbox from my-template with E2B's JS SDK on
// a server whose default runtime is runtime (serve --default-runtime).
func templateWithSDK(t *testing.T, jsDir string, st *imagestore.Store, runtime policy.Runtime) {
	e := newEnvSetup(t, true, envSetup{images: st, runtime: runtime})

	script := `
import { Sandbox } from 'e2b'
const out = {}
const sbx = await Sandbox.create('my-template')
const r = await sbx.commands.run('cat /opt/app/greeting.txt; echo "app=$APP_NAME"; test -x /bin/busybox && echo busybox')
out.stdout = r.stdout
out.info = (await sbx.getInfo()).templateId
await sbx.files.write('/home/user/note.txt', 'written')
out.read = await sbx.files.read('/home/user/note.txt')
// The template runs as root (no USER): user 'root' is its own user.
out.root = (await sbx.commands.run('id -u', { user: 'root' })).stdout
await sbx.files.write('/home/user/root.txt', 'as root', { user: 'root' })
out.rootRead = await sbx.files.read('/home/user/root.txt', { user: 'root' })
try { await sbx.commands.run('id -u', { user: 'user' }); out.asUser = 'no error' } catch (e) { out.asUser = e.name + ': ' + e.message }
await sbx.kill()
try { await Sandbox.create('no-such-template'); out.missing = 'no error' } catch (e) { out.missing = e.name + ': ' + e.message }
console.log(JSON.stringify(out))
process.exit(0)
`
	cmd := exec.Command("node", "--input-type=module", "-e", script)
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+e.url, "E2B_SANDBOX_URL="+e.url, "E2B_API_KEY="+e.key)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, b)
	}
	var out struct{ Stdout, Info, Read, Missing, Root, RootRead, AsUser string }
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("node output %q: %v", b, err)
	}
	t.Logf("%+v", out)
	if out.Stdout != "from the template\napp=demo\nbusybox\n" || out.Info != "my-template" || out.Read != "written" {
		t.Errorf("sandbox from my-template: %+v", out)
	}
	if out.Root != "0\n" || out.RootRead != "as root" {
		t.Errorf("user root in a template that runs as root: %+v", out)
	}
	if !strings.HasPrefix(out.AsUser, "AuthenticationError") || !strings.Contains(out.AsUser, "invalid username: 'user'") {
		t.Errorf("user 'user' in a sandbox that runs as root: %q", out.AsUser)
	}
	if !strings.HasPrefix(out.Missing, "SandboxError: 404: template 'no-such-template' not found") {
		t.Errorf("unknown template: %q", out.Missing)
	}
}
