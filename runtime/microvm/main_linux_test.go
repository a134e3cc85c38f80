package microvm

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestMain runs the jail probe when the test binary is re-executed as one
// (TestMicroVMJail), and otherwise the tests, then removes the directory
// agentBinary made (the agent, the initramfs cache and the VMs' state:
// ~145 MiB per test process, which piled up in /tmp when it was left).
func TestMain(m *testing.M) {
	if spec := os.Getenv(jailProbeEnv); spec != "" {
		jailProbe(spec)
		return
	}
	if os.Getenv(kvmProbeEnv) != "" { // TestKVMProbeDiesWithServer's child
		fmt.Println(probeKVM())
		return
	}
	code := m.Run()
	if agentPath != "" {
		os.RemoveAll(filepath.Dir(agentPath))
	}
	os.Exit(code)
}
