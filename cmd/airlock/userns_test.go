package main

import (
	"encoding/json"
	"os"
	"os/exec"
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

// TestConcurrentRunsOwnRanges: two `airlock run`s at once map disjoint host
// id ranges (read from the host-visible uid_map each prints).
func TestConcurrentRunsOwnRanges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("per-sandbox id ranges need root")
	}
	type res struct {
		out string
		err error
	}
	ch := make(chan res, 2)
	for i := 0; i < 2; i++ {
		go func() {
			cmd := exec.Command(airlockBin(t), "run", "--", "sh", "-c", "cat /proc/self/uid_map; sleep 2")
			out, err := cmd.Output()
			ch <- res{string(out), err}
		}()
	}
	var bases []string
	for i := 0; i < 2; i++ {
		r := <-ch
		f := strings.Fields(r.out)
		if r.err != nil || len(f) != 3 || f[0] != "0" || f[2] != "65536" {
			t.Fatalf("run: %q %v", r.out, r.err)
		}
		bases = append(bases, f[1])
	}
	if bases[0] == bases[1] {
		t.Fatalf("two concurrent runs share host ids from %s", bases[0])
	}
}
