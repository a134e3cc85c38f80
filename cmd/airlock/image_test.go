package main

import (
	"archive/tar"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	it "airlock/imagestore/imagetest"
)

// TestImageCLI: airlock image pull (with progress) | import | ls |
// inspect | rm against a registry on 127.0.0.1.
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
		Layers []struct{ DiffID string `json:"diff_id"` }
		Config struct{ Env []string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.Digest != digest || len(got.Layers) != 1 || len(got.Config.Env) != 2 {
		t.Fatalf("inspect: %d %q %q", code, out, errOut)
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
