package main

import (
	"errors"
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
