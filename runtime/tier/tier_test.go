package tier_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/tier"
	_ "github.com/airlock-dev/airlock/runtime/tiers"
)

// TestRegistry: the built-in tiers are registered under their names, an
// unknown one is refused with the list, and a refusal names the tier, the
// capability and the tiers that have it.
func TestRegistry(t *testing.T) {
	for _, n := range []policy.Runtime{policy.RuntimeNative, policy.RuntimeGVisor, policy.RuntimeWasm, policy.RuntimeMicroVM} {
		tr, err := tier.Lookup(n)
		if err != nil || tr.Name() != n {
			t.Fatalf("lookup %s: %v %v", n, tr, err)
		}
	}
	if d, err := tier.Lookup(""); err != nil || d.Name() != policy.RuntimeNative {
		t.Fatalf("the default tier: %v %v", d, err)
	}
	if _, err := tier.Lookup("kvm"); !errors.Is(err, tier.ErrUnknown) || !strings.Contains(err.Error(), "gvisor") {
		t.Fatalf("unknown tier: %v", err)
	}
	wasm, _ := tier.Lookup(policy.RuntimeWasm)
	err := tier.Refuse(wasm, "volumes", "volumes")
	if !errors.Is(err, tier.ErrNotSupported) || !strings.Contains(err.Error(), "runtime wasm does not support volumes") ||
		!strings.Contains(err.Error(), "runtimes that have it: gvisor, microvm, native") {
		t.Fatalf("refusal: %v", err)
	}
	mvm, _ := tier.Lookup(policy.RuntimeMicroVM)
	if err := tier.Refuse(mvm, "a network attached later", "attach_network"); !strings.Contains(err.Error(), "runtime microvm does not support a network attached later") ||
		!strings.Contains(err.Error(), "(capability attach_network; runtimes that have it: gvisor, native)") {
		t.Fatalf("attach_network refusal: %v", err)
	}
	if err := tier.Refuse(wasm, "a memory snapshot", "memory_snapshot"); !strings.Contains(err.Error(), "(capability memory_snapshot; runtimes that have it: gvisor, microvm)") {
		t.Fatalf("memory snapshot refusal: %v", err)
	}
	// Each capability a tier declares has the optional interface behind it.
	for _, n := range tier.Names() {
		tr, _ := tier.Lookup(n)
		c := tr.Caps()
		if _, ok := tr.(tier.Forker); c.MemorySnapshot && !ok {
			t.Errorf("%s declares memory_snapshot but cannot fork", n)
		}
		if _, ok := tr.(tier.Adopter); c.AdoptRunning && !ok {
			t.Errorf("%s declares adopt_running but cannot adopt", n)
		}
	}
}
