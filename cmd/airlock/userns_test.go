package main

import (
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestUnprivilegedRangeSaysSo: without root a run maps only the caller's
// uid (no range of its own) and its result says so; as root it reports a
// range of its own.
func TestUnprivilegedRangeSaysSo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to compare with an unprivileged user")
	}
	detail := func(cred *syscall.Credential) string {
		out, errOut, code := runCLI(t, cred, "run", "--json", "--", "true")
		if code != 0 {
			t.Fatalf("code %d err %q", code, errOut)
		}
		var res struct {
			Enforced []struct{ Name, State, Detail string }
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("%q: %v", out, err)
		}
		for _, l := range res.Enforced {
			if l.Name == "userns" {
				return l.Detail
			}
		}
		t.Fatalf("no userns layer in %q", out)
		return ""
	}
	if d := detail(&syscall.Credential{Uid: 65534, Gid: 65534}); !strings.Contains(d, "unprivileged") || !strings.Contains(d, "shared") {
		t.Errorf("unprivileged run: userns %q, want it to say the caller's uid is shared", d)
	}
	if d := detail(nil); !strings.Contains(d, "a range of its own") {
		t.Errorf("root run: userns %q, want a range of its own", d)
	}
}
