package main

import (
	"archive/tar"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	it "github.com/airlock-dev/airlock/imagestore/imagetest"
)

// TestImageCLI: airlock image pull (with progress) | import | ls |
// inspect | publish | unpublish | rm against a registry on 127.0.0.1.
func TestImageCLI(t *testing.T) {
	reg := it.Registry(t)
	img := it.Image(t, it.TarLayer(t, it.Entry{Name: "etc/image-marker", Type: tar.TypeReg, Data: strings.Repeat("m", 1<<20)}))
	ref := it.Push(t, reg, "cli/one:v1", img)
	state := t.TempDir()

	out, errOut, code := runCLI(t, nil, "image", "pull", "--state-dir", state, ref)
	if code != 0 || !strings.HasPrefix(out, ref+" sha256:") || !strings.Contains(errOut, "pulling ") {
		t.Fatalf("pull: %d %q %q", code, out, errOut)
	}
	digest := strings.Fields(out)[1]
	saved := filepath.Join(t.TempDir(), "saved.tar")
	tag, _ := name.NewTag("example.com/saved:2")
	if err := tarball.WriteToFile(saved, tag, img); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runCLI(t, nil, "image", "import", "--quiet", "--state-dir", state, saved); code != 0 || out != "example.com/saved:2 "+digest+"\n" {
		t.Fatalf("import: %d %q %q", code, out, errOut)
	}
	out, errOut, code = runCLI(t, nil, "image", "ls", "--state-dir", state)
	if code != 0 || !strings.Contains(out, ref) || !strings.Contains(out, "example.com/saved:2") || !strings.Contains(out, digest[7:19]) {
		t.Fatalf("ls: %d %q %q", code, out, errOut)
	}
	out, errOut, code = runCLI(t, nil, "image", "inspect", "--state-dir", state, digest[7:19])
	var got struct {
		Digest string
		Layers []struct {
			DiffID string `json:"diff_id"`
		}
		Config struct{ Env []string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.Digest != digest || len(got.Layers) != 1 || len(got.Config.Env) != 2 {
		t.Fatalf("inspect: %d %q %q", code, out, errOut)
	}
	// Owners: the CLI's images are the operator's; publish and unpublish
	// them; --key acts in a key's namespace, which does not hold them.
	if out, errOut, code := runCLI(t, nil, "image", "rm", "--state-dir", state, "--key", "key_0123456789abcdef", ref); code != 1 || !strings.Contains(errOut, "image not found") {
		t.Fatalf("rm --key of the operator's image: %d %q %q", code, out, errOut)
	}
	for _, c := range []struct{ sub, col string }{{"publish", "yes"}, {"unpublish", "no"}} {
		if out, errOut, code := runCLI(t, nil, "image", c.sub, "--state-dir", state, ref); code != 0 || !strings.HasPrefix(out, c.sub+"ed "+ref) {
			t.Fatalf("%s: %d %q %q", c.sub, code, out, errOut)
		}
		out, errOut, code := runCLI(t, nil, "image", "ls", "--state-dir", state)
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, ref+" ") {
				line = l
			}
		}
		if f := strings.Fields(line); code != 0 || len(f) < 2 || f[len(f)-2] != "-" || f[len(f)-1] != c.col {
			t.Fatalf("ls after %s: OWNER and PUBLIC of %q (%d %q)", c.sub, line, code, errOut)
		}
	}
	if out, errOut, code := runCLI(t, nil, "image", "rm", "--state-dir", state, ref); code != 0 || !strings.HasPrefix(out, "removed "+ref) {
		t.Fatalf("rm: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, nil, "image", "inspect", "--state-dir", state, ref); code != 1 || !strings.Contains(errOut, "image not found") {
		t.Fatalf("inspect removed: %d %q", code, errOut)
	}
	if _, errOut, code := runCLI(t, nil, "image", "frobnicate"); code != exitUsage || !strings.Contains(errOut, "unknown subcommand") {
		t.Fatalf("unknown subcommand: %d %q", code, errOut)
	}
}

// TestRunImage: airlock run --image pulls the image when it is missing,
// runs in a writable root made from it, and leaves the store unchanged and
// no per-sandbox root behind.
func TestRunImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("image roots need root")
	}
	ref := it.Push(t, it.Registry(t), "cli/busybox:1", it.Busybox(t))
	state := t.TempDir()
	// The root of a run whose launcher died (no such pid) is swept.
	stale := filepath.Join(state, "roots", "run-999999999-0123456789abcdef")
	os.MkdirAll(filepath.Join(stale, "disk"), 0o700)
	script := "cat /etc/image-marker; echo hi > /usr/local/x && cat /usr/local/x; id -u; echo $IMAGE"
	out, errOut, code := runCLI(t, nil, "run", "--state-dir", state, "--image", ref, "-e", "IMAGE=explicit", "--", "/bin/sh", "-c", script)
	if code != 0 || out != "from the image\nhi\n0\nexplicit\n" || !strings.Contains(errOut, "pulling ") {
		t.Fatalf("run --image: %d %q %q", code, out, errOut)
	}
	sig := func() string { // leases come and go; images and layers must not change
		return it.TreeSig(t, filepath.Join(state, "images", "oci")) + it.TreeSig(t, filepath.Join(state, "images", "layers"))
	}
	before := sig()
	out, errOut, code = runCLI(t, nil, "run", "--state-dir", state, "--image", ref, "--", "/bin/sh", "-c", "cat /usr/local/x 2>&1; echo $IMAGE")
	if code != 0 || out != "cat: can't open '/usr/local/x': No such file or directory\ntest\n" || errOut != "" {
		t.Fatalf("second run (fresh upper, image env): %d %q %q", code, out, errOut)
	}
	if after := sig(); after != before {
		t.Fatalf("the image store changed:\n%s\n%s", before, after)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale root of a dead run kept: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "roots")); len(ents) != 0 {
		t.Fatalf("per-sandbox roots left: %v", ents)
	}
	if _, errOut, code := runCLI(t, nil, "run", "--state-dir", state, "--image", "127.0.0.1:1/none:1", "--", "true"); code != exitSetup || !strings.Contains(errOut, "--image") {
		t.Fatalf("missing image: %d %q", code, errOut)
	}
}

// TestTemplateBuildCLI: airlock template build, then a rebuild from the
// cache, then a run of the result.
func TestTemplateBuildCLI(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	ref := it.Push(t, it.Registry(t), "cli/tmpl:1", it.Busybox(t))
	state, ctxDir := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM "+ref+"\nRUN echo built > /etc/built\nENV MODE=prod\n"), 0o644)
	build := func() (string, string, int) {
		return runCLI(t, nil, "template", "build", "--state-dir", state, "-t", "mine:1", ctxDir)
	}
	out, errOut, code := build()
	if code != 0 || !strings.HasPrefix(out, "index.docker.io/library/mine:1 sha256:") || !strings.Contains(errOut, "built in 3 steps, 0 cached") {
		t.Fatalf("build: %d %q %q", code, out, errOut)
	}
	out2, errOut, code := build()
	if code != 0 || out2 != out || !strings.Contains(errOut, "built in 3 steps, 2 cached") {
		t.Fatalf("rebuild: %d %q %q", code, out2, errOut)
	}
	out, errOut, code = runCLI(t, nil, "run", "--state-dir", state, "--image", "mine:1", "--", "/bin/sh", "-c", "cat /etc/built; echo $MODE")
	if code != 0 || out != "built\nprod\n" {
		t.Fatalf("run the template: %d %q %q", code, out, errOut)
	}
}

// TestTemplateBuildNet: a RUN step reaches a host only through the egress
// proxy and only when --net allows it.
func TestTemplateBuildNet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	pkg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "package-v1\n") }))
	defer pkg.Close()
	ref := it.Push(t, it.Registry(t), "cli/tmplnet:1", it.Busybox(t))
	state, ctxDir := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM "+ref+"\nRUN wget -q -O /opt/pkg "+pkg.URL+"/pkg\n"), 0o644)
	host := strings.TrimPrefix(pkg.URL, "http://")
	if _, errOut, code := runCLI(t, nil, "template", "build", "--state-dir", state, "-t", "net:1", ctxDir); code == 0 {
		t.Fatalf("RUN reached the network without --net: %q", errOut)
	}
	out, errOut, code := runCLI(t, nil, "template", "build", "--state-dir", state, "-t", "net:1", "--net", "allow:"+host, ctxDir)
	if code != 0 {
		t.Fatalf("build with --net allow:%s: %d %q %q", host, code, out, errOut)
	}
	out, errOut, code = runCLI(t, nil, "run", "--state-dir", state, "--image", "net:1", "--", "/bin/sh", "-c", "cat /opt/pkg")
	if code != 0 || out != "package-v1\n" {
		t.Fatalf("run: %d %q %q", code, out, errOut)
	}
}
