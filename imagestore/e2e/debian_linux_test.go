package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// TestDebianPipE2E is issue 13's test with real parts, all on 127.0.0.1: a
// Debian bookworm image made here by mmdebstrap (python3, python3-pip,
// python3-venv; cached by content, see imagetest.DebianLayer) pushed to
// go-containerregistry's registry, and a package index of a wheel built
// here served by a plain HTTP server, reached through the egress
// allowlist (the proxy resolves pkgs.test to 127.0.0.1, which the policy
// allows). Through the API: pull, create from the image, pip install into
// a venv inside the live sandbox, snapshot, create from the snapshot
// (without network) and import the package. Through the CLI: a template
// whose RUN step pip installs from the index (network given at build
// time), a rebuild that hits the cache for every step, and a run of the
// template that imports the package. Without the allowlist entry the
// install fails (the proxy refuses), so the index really is reached
// through the proxy.
func TestDebianPipE2E(t *testing.T) {
	testserver.NeedRoot(t)
	start := time.Now()
	layer, cached := it.DebianLayer(t)
	t.Logf("debian layer %s (cached %v) in %s", layer, cached, time.Since(start).Round(time.Millisecond))
	reg := it.Registry(t)
	ref := it.Push(t, reg, "debian/python:12", it.DebianPython(t))
	port := it.PyIndex(t)
	index := fmt.Sprintf("http://pkgs.test:%d/simple/", port)
	allow := []string{fmt.Sprintf("pkgs.test:%d", port), fmt.Sprintf("127.0.0.1:%d", port)}
	pip := "python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --index-url " + index +
		" --trusted-host pkgs.test " + it.PyPackage
	importIt := `/opt/venv/bin/python -c 'import airlock_demo; print(airlock_demo.hello())'`

	state := testserver.StateDir(t)
	s := testserver.Start(t, state, "--image-registry", reg, "--resolve", "pkgs.test=127.0.0.1")
	key := testserver.NewKey(t, state, "debian")
	c := client.New(s.URL, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pullStart := time.Now()
	if code, v := testserver.PostJSON(t, s.URL+"/v1/images", key, `{"ref":"`+ref+`"}`); code != 200 {
		t.Fatalf("pull: %d %v", code, v)
	}
	t.Logf("pull through the API: %s", time.Since(pullStart).Round(time.Millisecond))

	// Without the index in the allowlist the install is refused.
	denied, err := c.Create(ctx, client.CreateRequest{Image: ref, Network: &client.Network{Mode: "allowlist", Allow: []string{"127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, denied.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", pip + " --retries 0 --timeout 5"}})
	if err != nil || res.ExitCode == 0 || strings.Contains(res.Stdout, "Successfully installed") {
		t.Fatalf("pip install without the index allowed: %+v %v", res, err)
	}
	c.Kill(ctx, denied.ID)

	sb, err := c.Create(ctx, client.CreateRequest{Image: ref, Network: &client.Network{Mode: "allowlist", Allow: allow}})
	if err != nil {
		t.Fatal(err)
	}
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /etc/debian_version; " + pip + " && " + importIt}})
	if err != nil || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "12.") || !strings.Contains(res.Stdout, "Successfully installed "+it.PyPackage+"-1.0") ||
		!strings.HasSuffix(res.Stdout, it.PyHello+"\n") {
		t.Fatalf("pip install in the live sandbox: %+v %v", res, err)
	}
	if code, v := testserver.PostJSON(t, s.URL+"/v1/sandboxes/"+sb.ID+"/snapshot", key, `{"name":"debian/with-demo:1"}`); code != 201 {
		t.Fatalf("snapshot: %d %v", code, v)
	}
	c.Kill(ctx, sb.ID)
	sb2, err := c.Create(ctx, client.CreateRequest{Image: "debian/with-demo:1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err = c.Exec(ctx, sb2.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", importIt}})
	if err != nil || res.ExitCode != 0 || res.Stdout != it.PyHello+"\n" {
		t.Fatalf("import in a sandbox from the snapshot: %+v %v", res, err)
	}
	c.Kill(ctx, sb2.ID)

	// dpkg as the image's root: a package built inside the sandbox whose
	// postinst chowns a file to another user installs with "user": "root"
	// (root's capabilities in its own user namespace) and fails without.
	deb := `set -e
mkdir -p /tmp/pkg/DEBIAN /tmp/pkg/usr/local/bin /tmp/pkg/srv/demo
printf 'Package: airlock-demo-deb\nVersion: 1.0\nArchitecture: all\nMaintainer: airlock <t@example.com>\nDescription: airlock test\n' > /tmp/pkg/DEBIAN/control
printf '#!/bin/sh\nset -e\nchown 1234:1234 /srv/demo\n' > /tmp/pkg/DEBIAN/postinst
printf '#!/bin/sh\necho deb-ok\n' > /tmp/pkg/usr/local/bin/demo-deb
chmod 755 /tmp/pkg/DEBIAN/postinst /tmp/pkg/usr/local/bin/demo-deb
dpkg-deb --build --root-owner-group /tmp/pkg /tmp/demo.deb >/dev/null
dpkg -i /tmp/demo.deb >/dev/null
demo-deb
stat -c %u:%g /srv/demo
dpkg-query -W -f='${Status}\n' airlock-demo-deb`
	for _, root := range []bool{true, false} {
		req := client.CreateRequest{Image: ref}
		if root {
			req.User = "root"
		}
		sb, err := c.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", deb}})
		if err != nil {
			t.Fatal(err)
		}
		if want := "deb-ok\n1234:1234\ninstall ok installed\n"; root && (res.ExitCode != 0 || res.Stdout != want) {
			t.Fatalf("dpkg -i as root: %+v, want %q", res, want)
		}
		if !root && res.ExitCode == 0 {
			t.Fatalf("dpkg -i with a chowning postinst worked without user root: %+v", res)
		}
		c.Kill(ctx, sb.ID)
	}

	// The CLI: a template whose RUN pip installs from the index.
	cliState := t.TempDir()
	ctxDir := t.TempDir()
	df := filepath.Join(ctxDir, "Dockerfile")
	if err := os.WriteFile(df, []byte("FROM "+ref+"\nRUN "+pip+"\nENV DEMO=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := testserver.Binary(t)
	build := func() string {
		cmd := exec.Command(bin, "template", "build", "--state-dir", cliState, "-f", df, "-t", "debian/demo-template:1",
			"--net", "allow:"+strings.Join(allow, ","), "--resolve", "pkgs.test=127.0.0.1", ctxDir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("template build: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := build(); !strings.Contains(out, "Successfully installed "+it.PyPackage+"-1.0") {
		t.Fatalf("template build log lacks the install:\n%s", out)
	}
	if out := build(); strings.Contains(out, "Successfully installed") || !strings.Contains(out, "built in 3 steps, 2 cached") { // FROM is resolved, the RUN and ENV steps cached
		t.Fatalf("rebuild did not hit the cache for every step:\n%s", out)
	}
	out, err := exec.Command(bin, "run", "--state-dir", cliState, "--image", "debian/demo-template:1", "--", "/bin/sh", "-c", importIt+"; echo $DEMO").CombinedOutput()
	if err != nil || string(out) != it.PyHello+"\n1\n" {
		t.Fatalf("run of the template: %v %q", err, out)
	}
	t.Logf("whole test: %s", time.Since(start).Round(time.Millisecond))
}

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}
