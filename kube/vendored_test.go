package kube

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVendoredAgentSandboxUnchanged: deploy/agent-sandbox/k8s is the k8s/
// directory of the sigs.k8s.io/agent-sandbox module go.mod requires, file
// for file and byte for byte, and SOURCE.md and kustomization.yaml name
// that version: the manifests a cluster installs are those of the API
// types airlock is built with.
func TestVendoredAgentSandboxUnchanged(t *testing.T) {
	out, err := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/agent-sandbox").Output()
	if err != nil {
		t.Fatalf("go mod download sigs.k8s.io/agent-sandbox: %v", err)
	}
	var mod struct{ Version, Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download: %s (%v)", out, err)
	}
	upstream := filepath.Join(mod.Dir, "k8s")
	ours := filepath.Join("..", "deploy", "agent-sandbox", "k8s")
	files := func(root string) map[string][]byte {
		m := map[string][]byte{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			m[rel] = b
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	want, got := files(upstream), files(ours)
	if len(want) == 0 {
		t.Fatalf("no files in %s", upstream)
	}
	for name, b := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("deploy/agent-sandbox/k8s lacks %s of agent-sandbox %s", name, mod.Version)
		} else if !bytes.Equal(g, b) {
			t.Errorf("deploy/agent-sandbox/k8s/%s differs from agent-sandbox %s's", name, mod.Version)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("deploy/agent-sandbox/k8s/%s is not agent-sandbox %s's", name, mod.Version)
		}
	}
	for _, f := range []string{"SOURCE.md", "kustomization.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "deploy", "agent-sandbox", f))
		if err != nil || !strings.Contains(string(b), mod.Version) {
			t.Errorf("deploy/agent-sandbox/%s does not name %s (%v)", f, mod.Version, err)
		}
	}
}
