package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestCLISmoke is the CI smoke step of `airlock bench`: it builds the
// airlock binary, runs `airlock bench --runs 3 --only cold --json` and
// checks that the output is valid JSON holding the cold figures with
// samples for airlock and the bare floor. It asserts no timing.
func TestCLISmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	if runtime.GOOS != "linux" {
		t.Skip("airlock sandboxes need Linux")
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	bin := filepath.Join(t.TempDir(), "airlock")
	build := exec.Command(goTool, "build", "-o", bin, "airlock/cmd/airlock")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "bench", "--runs", "3", "--only", "cold", "--json", "--scratch", t.TempDir())
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("airlock bench: %v\nstderr:\n%s", err, stderr.String())
	}
	var rep Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	want := map[string]bool{"cold start": false, "cold python": false, "cold start (in-process)": false}
	for _, f := range rep.Figures {
		if _, ok := want[f.Name]; !ok {
			t.Errorf("unexpected figure %q with --only cold", f.Name)
			continue
		}
		want[f.Name] = true
		if f.Rounds != 3 {
			t.Errorf("%s: %d rounds, want 3", f.Name, f.Rounds)
		}
		for _, peer := range []string{Reference, "bare"} {
			r := f.Result(peer)
			if r == nil || len(r.Samples) == 0 {
				t.Errorf("%s: no samples for %s: %+v", f.Name, peer, r)
			}
		}
		for _, r := range f.Results {
			if r.Missing == "" && len(r.Samples) == 0 {
				t.Logf("%s: %s failed: %s", f.Name, r.Peer, r.Error)
			}
		}
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("figure %q missing from the output", name)
		}
	}
	if rep.Machine == nil || rep.LoadBefore == "" {
		t.Errorf("report lacks the machine or the load: %+v", rep)
	}
}
