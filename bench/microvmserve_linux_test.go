package bench

import (
	"os"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/runtime/microvm"
)

// TestMicroVMServeFigures: the microvm figures through airlock serve each
// measure the microvm peer (and, where the figure has them, QEMU booting
// the same kernel and native and gVisor sandboxes of the same server) with
// every sample successful, and name the accelerator; the pause figures
// checked the session's bytes after the rounds.
func TestMicroVMServeFigures(t *testing.T) {
	testserver.NeedRoot(t)
	if err := (microvm.Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	microvm.Accel = microvm.AccelTCG       // no KVM probe here
	scratch, err := os.MkdirTemp("", "bm") // short: the agent's socket path is limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratch) })
	figs := MicroVMServeFigures(testserver.Binary(t), scratch, 1, DensityOptions{Max: 1}, 0)
	want := []string{"microvm create to first exec (tcg)", "microvm exec (tcg)", "microvm pause (100 MB Python) (tcg)",
		"microvm resume (100 MB Python) (tcg)", "microvm idle memory (tcg)"}
	if len(figs) != len(want) {
		t.Fatalf("%d figures: %+v", len(figs), figs)
	}
	for i, f := range figs {
		if f.Name != want[i] || f.Unavailable != "" {
			t.Errorf("figure %d: %q (unavailable: %s), want %q", i, f.Name, f.Unavailable, want[i])
			continue
		}
		measured := 0
		for _, r := range f.Results {
			if r.Missing != "" {
				continue
			}
			if r.Error != "" || len(r.Samples) == 0 {
				t.Errorf("%s: %s: %+v", f.Name, r.Peer, r)
			}
			measured++
		}
		if f.Result(Reference) == nil || len(f.Result(Reference).Samples) == 0 {
			t.Errorf("%s: the microvm peer has no sample", f.Name)
		}
		if strings.HasPrefix(f.Name, "microvm create") && (f.Result("qemu") == nil || len(f.Result("qemu").Samples) == 0) {
			t.Errorf("%s: QEMU booting the same kernel was not measured", f.Name)
		}
		t.Logf("%s: %d peers measured", f.Name, measured)
	}
}
