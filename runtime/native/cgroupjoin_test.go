package native_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

// TestStartJoinsCgroups: read from the host, the sandbox's init is in its
// own group in every hierarchy the group has (on cgroup v1 the child moves
// itself there through the tasks files before it runs anything), and an
// agent sandbox's init starts in the workload child group for memory and
// pids.
func TestStartJoinsCgroups(t *testing.T) {
	info := cgroups.Detect()
	if info.Version == 0 {
		t.Skip("no cgroups: ", info.Reason)
	}
	for _, agent := range []bool{false, true} {
		t.Run(fmt.Sprint("agent=", agent), func(t *testing.T) {
			sb, err := native.Start(native.Config{Policy: strict(t), Agent: agent, Args: []string{"/bin/sleep", "30"}})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy()
			raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sb.Pid))
			if err != nil {
				t.Fatal(err)
			}
			want := "/airlock/" + sb.ID
			if info.Version == 2 {
				want = "/" + sb.ID // under the delegated directory
			}
			seen := 0
			for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
				f := strings.SplitN(line, ":", 3)
				if len(f) != 3 {
					t.Fatalf("bad /proc/pid/cgroup line %q", line)
				}
				ctrls := "," + f[1] + ","
				if f[1] == "" {
					if info.Version == 1 {
						continue // the unused v2 hierarchy
					}
					ctrls = ",memory,pids,cpu," // the v2 line names no controller
				}
				inGroup := false
				for _, c := range []string{"memory", "pids", "cpu", "freezer"} {
					inGroup = inGroup || strings.Contains(ctrls, ","+c+",")
				}
				if !inGroup {
					continue
				}
				w := want
				if agent && info.Version == 1 && (strings.Contains(ctrls, ",memory,") || strings.Contains(ctrls, ",pids,")) {
					w = want + "/" + cgroups.WorkloadName
				}
				if !strings.HasSuffix(f[2], w) {
					t.Errorf("hierarchy %q: init in %q, want %q", f[1], f[2], w)
				}
				seen++
			}
			if seen == 0 {
				t.Fatalf("no memory/pids/cpu/freezer hierarchy in %q", raw)
			}
		})
	}
}
