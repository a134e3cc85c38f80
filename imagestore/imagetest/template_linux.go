package imagetest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/template"
)

// Template builds a template named name into a fresh image store under a
// temporary directory and returns the store: FROM the Busybox image pushed
// to a registry on 127.0.0.1, then the Dockerfile lines steps, with files
// (name to content, mode 0755) as the build context. Busybox has no bash
// applet; the context's file "bash", if given, can stand in for it (E2B's
// SDKs start commands as /bin/bash -l -c).
func Template(t testing.TB, name string, files map[string]string, steps ...string) *imagestore.Store {
	t.Helper()
	state := t.TempDir()
	st, err := imagestore.Open(filepath.Join(state, "images"), imagestore.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ref := Push(t, Registry(t), "tmpl/busybox:1", Busybox(t))
	ctxDir := t.TempDir()
	for n, data := range files {
		if err := os.WriteFile(filepath.Join(ctxDir, n), []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	df := filepath.Join(ctxDir, "Dockerfile")
	if err := os.WriteFile(df, []byte("FROM "+ref+"\n"+strings.Join(steps, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := policy.Preset(policy.Strict)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	if _, err := template.Build(context.Background(), template.Options{Dockerfile: df, Context: ctxDir, Name: name,
		Store: st, StateDir: state, Policy: p, Log: &log}); err != nil {
		t.Fatalf("template build: %v\n%s", err, log.String())
	}
	return st
}
