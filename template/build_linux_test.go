package template_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/imagestore"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/template"
)

// TestBuild: a Dockerfile with FROM, ARG, ENV, COPY, RUN and WORKDIR builds
// an image whose sandboxes see the copied and the RUN-made files (a RUN of
// the image's root has root's capabilities: its chown holds), the env and
// the working directory; a second build hits the cache at every step
// and gives the same image.
func TestBuild(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	ref := it.Push(t, it.Registry(t), "tmpl/busybox:1", it.Busybox(t))
	state := t.TempDir()
	st, err := imagestore.Open(filepath.Join(state, "images"), imagestore.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "hello.txt"), []byte("copied\n"), 0o644)
	os.Symlink("/etc/shadow", filepath.Join(ctxDir, "link"))
	df := filepath.Join(ctxDir, "Dockerfile")
	os.WriteFile(df, []byte(`FROM `+ref+`
ARG GREETING=hello
ENV APP=/opt/app
COPY hello.txt link $APP/
RUN echo "$GREETING from run" > /opt/app/run.txt && rm /etc/image-marker && chown 1234:1234 /opt/app/run.txt
WORKDIR /opt/app
`), 0o644)
	p, err := policy.Preset(policy.Strict)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	opts := template.Options{Dockerfile: df, Context: ctxDir, Name: "tmpl/app:1", Store: st, StateDir: state, Policy: p,
		Args: map[string]string{"GREETING": "hi"}, Log: &log}
	res, err := template.Build(context.Background(), opts)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, log.String())
	}
	if res.Cached != 0 || res.Image.Name != "index.docker.io/tmpl/app:1" {
		t.Fatalf("first build: %+v", res)
	}
	img, err := st.Get("tmpl/app:1")
	if err != nil {
		t.Fatal(err)
	}
	sp := p
	if err := img.ApplyTo(&sp); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, "roots", "check")
	defer native.RemoveImageRoot(dir)
	r, err := native.Run(context.Background(), native.Config{Policy: sp, Args: []string{"/bin/sh", "-c",
		"cat hello.txt run.txt; pwd; echo $APP; readlink link; test ! -e /etc/image-marker && echo marker-gone; stat -c %u:%g run.txt"},
		Image: &native.ImageRoot{Layers: img.LayerDirs(), Dir: dir}}, native.RunOptions{Capture: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := "copied\nhi from run\n/opt/app\n/opt/app\n/etc/shadow\nmarker-gone\n1234:1234\n"; r.Stdout != want {
		t.Fatalf("sandbox from the template: %+v\nwant %q", r, want)
	}
	log.Reset()
	// A context written afresh (as the API writes it for every build) has
	// new modification times but the same files: the cache still hits.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(ctxDir, "hello.txt"), later, later); err != nil {
		t.Fatal(err)
	}
	res2, err := template.Build(context.Background(), opts)
	if err != nil {
		t.Fatalf("rebuild: %v\n%s", err, log.String())
	}
	if res2.Cached != 4 || res2.Image.Digest != res.Image.Digest {
		t.Fatalf("rebuild: %d of %d steps cached, digest %s vs %s\n%s", res2.Cached, res2.Steps, res2.Image.Digest, res.Image.Digest, log.String())
	}
}
