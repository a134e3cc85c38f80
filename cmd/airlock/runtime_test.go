package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestRunRuntimeFlag: --runtime gvisor runs the command under gVisor's
// kernel (JSON result with the gvisor layer), a code cell works there too,
// and an unknown runtime is a usage error naming the choices.
func TestRunRuntimeFlag(t *testing.T) {
	_, errOut, code := runCLI(t, nil, "run", "--runtime", "kvm", "--", "true")
	if code != exitUsage || !strings.Contains(errOut, `unknown "kvm" (want native, gvisor, wasm or microvm)`) {
		t.Fatalf("unknown runtime: code %d err %q", code, errOut)
	}
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	out, errOut, code := runCLI(t, nil, "run", "--runtime", "gvisor", "--json", "--", "uname", "-r")
	var res struct {
		Status   string
		Stdout   string
		Enforced []struct{ Name, State, Detail string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 {
		t.Fatalf("code %d out %q err %q: %v", code, out, errOut, err)
	}
	if res.Status != "ok" || !strings.Contains(res.Stdout, "gvisor") || len(res.Enforced) == 0 || res.Enforced[0].Name != "gvisor" {
		t.Fatalf("got %+v", res)
	}
	out, errOut, code = runCLI(t, nil, "run", "--runtime", "gvisor", "--code", "x = 6*7\nx")
	if code != 0 || !strings.Contains(out, "42") {
		t.Fatalf("code cell under gvisor: code %d out %q err %q", code, out, errOut)
	}
}
