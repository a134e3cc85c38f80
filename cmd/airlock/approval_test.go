package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/approval"
)

// TestKeysCreateApprovalPolicy: keys create --approval-policy stores a
// valid policy (YAML here) with the key, and refuses a bad one without
// creating the key; serve refuses a bad server policy.
func TestKeysCreateApprovalPolicy(t *testing.T) {
	state := t.TempDir()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(good, []byte("deny:\n  - {action: exec, argv: \"^pip install\"}\n"), 0o600)
	os.WriteFile(bad, []byte(`{"deny":[{"action":"exec","argvv":"x"}]}`), 0o600)

	if _, errOut, code := runCLI(t, nil, "keys", "create", "--name", "bad", "--approval-policy", bad, "--state-dir", state); code == 0 || !strings.Contains(errOut, "argvv") {
		t.Fatalf("bad policy: exit %d, stderr %q", code, errOut)
	}
	out, _, _ := runCLI(t, nil, "keys", "list", "--state-dir", state)
	if strings.Contains(out, "bad") {
		t.Fatalf("a key was created with a bad policy:\n%s", out)
	}
	_, errOut, code := runCLI(t, nil, "keys", "create", "--name", "agent", "--approval-policy", good, "--state-dir", state)
	if code != 0 {
		t.Fatalf("create: %d %q", code, errOut)
	}
	files, _ := filepath.Glob(filepath.Join(state, approval.KeyPolicyDir, "key_*.json"))
	if len(files) != 1 || !strings.Contains(errOut, strings.TrimSuffix(filepath.Base(files[0]), ".json")) {
		t.Fatalf("stored policies %v for %q", files, errOut)
	}
	b, _ := os.ReadFile(files[0])
	if p, err := approval.Parse(b); err != nil || len(p.Deny) != 1 || p.Deny[0].Argv != "^pip install" {
		t.Fatalf("stored policy %s: %+v %v", b, p, err)
	}

	if _, errOut, code := runCLI(t, nil, "serve", "--state-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--approval-policy", bad); code == 0 || !strings.Contains(errOut, "argvv") {
		t.Fatalf("serve with a bad policy: exit %d, stderr %q", code, errOut)
	}
}
