package bench

import (
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/runtime/microvm"
)

// TestMicroVMFigure: the microvm cold start figure runs airlock's
// one-shot microvm run and QEMU booting the same kernel, in the same run,
// with every sample successful, and names the accelerator.
func TestMicroVMFigure(t *testing.T) {
	if err := (microvm.Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	microvm.Accel = microvm.AccelTCG // the figure names what it ran on; no KVM probe here
	f := MicroVMFigure(testserver.Binary(t), t.TempDir(), 2, 0)
	if !strings.HasPrefix(f.Name, "microvm cold start (") || f.Unavailable != "" || len(f.Results) != 2 {
		t.Fatalf("figure: %+v", f)
	}
	for _, r := range f.Results {
		if r.Missing != "" || r.Error != "" || len(r.Samples) != 2 {
			t.Errorf("%s: %+v", r.Peer, r)
		}
	}
}
