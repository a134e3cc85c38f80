package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestBenchKubernetesNeedsCluster: `airlock bench --only kubernetes` on a
// machine with no cluster named refuses (exit 123), says what it needs and
// measures nothing; an unknown key is still a usage error.
func TestBenchKubernetesNeedsCluster(t *testing.T) {
	out, err := exec.Command(airlockBin(t), "bench", "--only", "kubernetes").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitSetup || !strings.Contains(string(out), "needs a real cluster") || strings.Contains(string(out), "first exec") {
		t.Fatalf("bench --only kubernetes without a cluster: %v\n%s", err, out)
	}
	out, err = exec.Command(airlockBin(t), "bench", "--only", "kubernetes,nope").CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || !strings.Contains(string(out), `unknown figure "nope"`) {
		t.Fatalf("bench --only kubernetes,nope: %v\n%s", err, out)
	}
}
