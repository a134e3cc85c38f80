package microvm

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain removes the directory agentBinary made (the agent, the
// initramfs cache and the VMs' state: ~145 MiB per test process, which
// piled up in /tmp when it was left).
func TestMain(m *testing.M) {
	code := m.Run()
	if agentPath != "" {
		os.RemoveAll(filepath.Dir(agentPath))
	}
	os.Exit(code)
}
