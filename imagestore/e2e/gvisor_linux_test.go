package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestDebianPipGVisorE2E is TestDebianPipE2E's API part under gVisor
// (issue 26): a Debian image sandbox with "runtime": "gvisor" pip
// installs from the local index through the allowlist (and is refused
// without it), a Python cell imports the package, the root is snapshotted
// to an image and a gVisor sandbox created from that image imports it
// again; the snapshot holds the files with the sandbox's own owners (a
// native sandbox from it sees them as the gVisor one did).
func TestDebianPipGVisorE2E(t *testing.T) {
	testserver.NeedRoot(t)
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor: %v", err)
	}
	it.DebianLayer(t)
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
	key := testserver.NewKey(t, state, "gvdebian")
	c := client.New(s.URL, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if code, v := testserver.PostJSON(t, s.URL+"/v1/images", key, `{"ref":"`+ref+`"}`); code != 200 {
		t.Fatalf("pull: %d %v", code, v)
	}
	create := func(req client.CreateRequest) *client.Sandbox {
		t.Helper()
		req.Runtime = "gvisor"
		sb, err := c.Create(ctx, req)
		if err != nil {
			t.Fatalf("create %+v: %v", req, err)
		}
		if sb.Runtime != "gvisor" {
			t.Fatalf("created under %q, want gvisor", sb.Runtime)
		}
		return sb
	}

	// Without the index in the allowlist the install is refused.
	denied := create(client.CreateRequest{Image: ref, Network: &client.Network{Mode: "allowlist", Allow: []string{"127.0.0.1:1"}}})
	res, err := c.Exec(ctx, denied.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", pip + " --retries 0 --timeout 5"}})
	if err != nil || res.ExitCode == 0 || strings.Contains(res.Stdout, "Successfully installed") {
		t.Fatalf("pip install without the index allowed: %+v %v", res, err)
	}
	c.Kill(ctx, denied.ID)

	sb := create(client.CreateRequest{Image: ref, Network: &client.Network{Mode: "allowlist", Allow: allow}})
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "uname -r; cat /etc/debian_version; id -u; " + pip}})
	if err != nil || res.ExitCode != 0 || !strings.Contains(res.Stdout, "gvisor") && !strings.Contains(res.Stdout, "4.4.0") ||
		!strings.Contains(res.Stdout, "\n12.") || !strings.Contains(res.Stdout, "Successfully installed "+it.PyPackage+"-1.0") {
		t.Fatalf("pip install in the live gVisor sandbox: %+v %v", res, err)
	}
	cell, err := c.RunCode(ctx, sb.ID, client.CodeRequest{Language: "python", Code: "import glob, site\nsite.addsitedir(glob.glob('/opt/venv/lib/python3*/site-packages')[0])\nimport airlock_demo\nprint(airlock_demo.hello())"})
	if err != nil || cell.Error != nil || !strings.Contains(cell.Stdout, it.PyHello) {
		t.Fatalf("python cell importing the package: %+v %v", cell, err)
	}
	owners, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "stat -c %u:%g /opt/venv/bin/python /workspace"}})
	if err != nil || owners.ExitCode != 0 {
		t.Fatalf("stat: %+v %v", owners, err)
	}
	if code, v := testserver.PostJSON(t, s.URL+"/v1/sandboxes/"+sb.ID+"/snapshot", key, `{"name":"debian/gv-demo:1"}`); code != 201 {
		t.Fatalf("snapshot of a gVisor image sandbox: %d %v", code, v)
	}
	c.Kill(ctx, sb.ID)

	sb2 := create(client.CreateRequest{Image: "debian/gv-demo:1"})
	res, err = c.Exec(ctx, sb2.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", importIt}})
	if err != nil || res.ExitCode != 0 || res.Stdout != it.PyHello+"\n" {
		t.Fatalf("import in a gVisor sandbox from the snapshot: %+v %v", res, err)
	}
	c.Kill(ctx, sb2.ID)

	// A native sandbox from the same snapshot sees the same owners.
	nat, err := c.Create(ctx, client.CreateRequest{Image: "debian/gv-demo:1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err = c.Exec(ctx, nat.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "stat -c %u:%g /opt/venv/bin/python /workspace; " + importIt}})
	if err != nil || res.ExitCode != 0 || res.Stdout != owners.Stdout+it.PyHello+"\n" {
		t.Fatalf("native sandbox from the gVisor snapshot: %+v %v (gVisor saw owners %q)", res, err, owners.Stdout)
	}
	c.Kill(ctx, nat.ID)
}

// TestGVisorRootUserHostile: "user": "root" in a gVisor image sandbox is
// uid 0 inside the sentry with the root capabilities (chown works) and
// nothing to reach the agent with: prlimit, signals and set*id to the
// agent's uid are refused, the agent answers afterwards, and a host file
// outside the sandbox's root is not there. Before issue 26 the create was
// refused (capability image_roots); a uid-0 workload's agent would have
// shared its uid.
func TestGVisorRootUserHostile(t *testing.T) {
	testserver.NeedRoot(t)
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor: %v", err)
	}
	it.DebianLayer(t)
	reg := it.Registry(t)
	ref := it.Push(t, reg, "debian/python:12", it.DebianPython(t))
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("host only\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	state := testserver.StateDir(t)
	s := testserver.Start(t, state, "--image-registry", reg)
	key := testserver.NewKey(t, state, "gvroot")
	c := client.New(s.URL, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if code, v := testserver.PostJSON(t, s.URL+"/v1/images", key, `{"ref":"`+ref+`"}`); code != 200 {
		t.Fatalf("pull: %d %v", code, v)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Image: ref, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.ID)
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c",
		"mkdir -p /opt/pkg && echo x > /opt/pkg/f && chown 1234:1234 /opt/pkg/f && stat -c %u:%g /opt/pkg/f; id -u; grep CapEff /proc/self/status; uname -r"}})
	if err != nil || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "1234:1234\n0\nCapEff:\t00000000000004cf\n") || !strings.Contains(res.Stdout, "gvisor") {
		t.Fatalf("as root under gVisor: %+v %v", res, err)
	}
	hostile := `
import os, resource, signal
def try_(name, f):
    try:
        f()
        print(name, "allowed")
    except OSError as e:
        print(name, "denied", e.errno)
try_("prlimit", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (1, 1)))
try_("prlimit_as", lambda: resource.prlimit(1, resource.RLIMIT_AS, (1 << 20, 1 << 20)))
for s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGTERM):
    try_("kill_" + s.name, lambda: os.kill(1, s))
def become(f):
    pid = os.fork()
    if pid == 0:
        try:
            f()
            os._exit(0)
        except OSError as e:
            os._exit(e.errno)
    return os.waitpid(pid, 0)[1] >> 8
for name, f in (("setuid", lambda: os.setuid(65532)), ("setresuid", lambda: os.setresuid(-1, -1, 65532)), ("setreuid", lambda: os.setreuid(65532, -1))):
    code = become(f)
    print(name, "allowed" if code == 0 else "denied %d" % code)
print("secret", os.path.exists(` + "'" + secret + "'" + `))
`
	if _, err := c.WriteFile(ctx, sb.ID, "/tmp/hostile.py", strings.NewReader(hostile), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"python3", "/tmp/hostile.py"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("hostile script: %+v %v", res, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		if strings.Contains(line, "allowed") || line == "secret True" {
			t.Errorf("root under gVisor reached the agent or the host: %s", line)
		}
	}
	if !strings.Contains(res.Stdout, "secret False") || strings.Count(res.Stdout, "denied") != 9 {
		t.Fatalf("hostile script output: %q", res.Stdout)
	}
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo agent-alive"}})
	if err != nil || res.Stdout != "agent-alive\n" {
		t.Fatalf("the agent did not survive root's attempts: %+v %v", res, err)
	}
}

// TestGVisorVolumeShared: a volume is shared between a gVisor and a native
// sandbox with the same owners: files the gVisor sandbox's user writes
// (and chowns, as root) are seen by the native one with the same uids and
// gids, and the other way round. Before issue 26 the gVisor create was
// refused (capability volumes).
func TestGVisorVolumeShared(t *testing.T) {
	testserver.NeedRoot(t)
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor: %v", err)
	}
	it.DebianLayer(t)
	reg := it.Registry(t)
	ref := it.Push(t, reg, "debian/python:12", it.DebianPython(t))
	state := testserver.StateDir(t)
	s := testserver.Start(t, state, "--image-registry", reg)
	key := testserver.NewKey(t, state, "gvvol")
	c := client.New(s.URL, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if code, v := testserver.PostJSON(t, s.URL+"/v1/images", key, `{"ref":"`+ref+`"}`); code != 200 {
		t.Fatalf("pull: %d %v", code, v)
	}
	if code, v := testserver.PostJSON(t, s.URL+"/v1/volumes", key, `{"name":"shared","size_bytes":16777216}`); code != 201 {
		t.Fatalf("volume: %d %v", code, v)
	}
	vols := []client.VolumeRef{{Name: "shared", Path: "/data"}}
	gv, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Image: ref, User: "root", Volumes: vols})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, gv.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c",
		"echo from-gvisor > /data/g && mkdir /data/d && chown 1234:2345 /data/d && stat -c '%n %u:%g' /data/g /data/d"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("gvisor writes the volume: %+v %v", res, err)
	}
	gvSaw := res.Stdout
	if err := c.Kill(ctx, gv.ID); err != nil {
		t.Fatal(err)
	}
	nat, err := c.Create(ctx, client.CreateRequest{Image: ref, User: "root", Volumes: vols})
	if err != nil {
		t.Fatal(err)
	}
	res, err = c.Exec(ctx, nat.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c",
		"stat -c '%n %u:%g' /data/g /data/d && cat /data/g && echo from-native > /data/n && chown 4321:4321 /data/n"}})
	if err != nil || res.ExitCode != 0 || res.Stdout != gvSaw+"from-gvisor\n" {
		t.Fatalf("native sees the volume as gvisor left it: %+v %v (gvisor saw %q)", res, err, gvSaw)
	}
	c.Kill(ctx, nat.ID)
	gv2, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Image: ref, Volumes: vols})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, gv2.ID)
	res, err = c.Exec(ctx, gv2.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "stat -c '%n %u:%g' /data/n && cat /data/n"}})
	if err != nil || res.ExitCode != 0 || res.Stdout != "/data/n 4321:4321\nfrom-native\n" {
		t.Fatalf("gvisor sees the native sandbox's file: %+v %v", res, err)
	}
}
