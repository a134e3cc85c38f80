package agent

import (
	"strings"
	"testing"
)

// TestMountTmpfsRefusesBadArguments: without "--tmpfs" nothing happens;
// a malformed one or an unknown option is an error before anything is
// mounted (the agent then exits: no sandbox without its limits).
func TestMountTmpfsRefusesBadArguments(t *testing.T) {
	if err := mountTmpfs([]string{"__agent", "--user", "1000:1000"}); err != nil {
		t.Fatalf("no --tmpfs: %v", err)
	}
	for arg, want := range map[string]string{
		"--tmpfs=workspace=size=1k":          "want TARGET=OPTIONS",
		"--tmpfs=/workspace":                 "want TARGET=OPTIONS",
		"--tmpfs=/workspace=size=1k,suid_ok": "unknown option",
	} {
		if err := mountTmpfs([]string{"__agent", arg}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", arg, err, want)
		}
	}
}
