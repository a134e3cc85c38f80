package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestServeBackendKubernetesNeedsTag: the default build knows the flag but
// refuses --backend kubernetes, naming the build that has it (the backend
// itself is tested in package kube with a -tags kubernetes build).
func TestServeBackendKubernetesNeedsTag(t *testing.T) {
	out, err := exec.Command(airlockBin(t), "serve", "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--no-auth",
		"--backend", "kubernetes", "--namespace", "x", "--agent-image", "a", "--default-image", "b").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || !strings.Contains(string(out), "go build -tags kubernetes") {
		t.Fatalf("serve --backend kubernetes in the default build: %v\n%s", err, out)
	}
	out, err = exec.Command(airlockBin(t), "serve", "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--no-auth",
		"--backend", "nomad").CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || !strings.Contains(string(out), "want native or kubernetes") {
		t.Fatalf("serve --backend nomad: %v\n%s", err, out)
	}
}

// TestServePoolImageRefusals: --pool-image is refused, before anything is
// opened, without --pool and with --backend kubernetes (the cluster's warm
// pool holds the default image only), in either build.
func TestServePoolImageRefusals(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no pool", []string{"--pool-image", "desk"}, "--pool-image needs --pool N"},
		{"kubernetes", []string{"--pool", "2", "--pool-image", "desk", "--backend", "kubernetes", "--namespace", "x",
			"--agent-image", "a", "--default-image", "b"}, "--pool-image is not available with --backend kubernetes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", dir, "--no-auth"}, c.args...)
			out, err := exec.Command(airlockBin(t), args...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || !strings.Contains(string(out), c.want) {
				t.Fatalf("airlock %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Fatalf("a refused serve left %d entries in its state directory", len(ents))
			}
		})
	}
}
