package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var airlockBin struct {
	sync.Once
	path string
	err  error
	out  []byte
}

// buildAirlock builds the airlock binary once per test binary, into a
// directory removed by TestMain.
func buildAirlock(t testing.TB) string {
	t.Helper()
	airlockBin.Do(func() {
		goTool := "go" // go test puts its own toolchain first on $PATH
		dir, err := os.MkdirTemp("", "bench-airlock-")
		if err != nil {
			airlockBin.err = err
			return
		}
		buildDir = dir
		airlockBin.path = filepath.Join(dir, "airlock")
		// Static, as the README builds it: a cgo build cannot host the agent.
		build := exec.Command(goTool, "build", "-o", airlockBin.path, "github.com/airlock-dev/airlock/cmd/airlock")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		airlockBin.out, airlockBin.err = build.CombinedOutput()
	})
	if airlockBin.err != nil {
		t.Fatalf("go build airlock: %v\n%s", airlockBin.err, airlockBin.out)
	}
	return airlockBin.path
}

// buildDir is removed after the tests.
var buildDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

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
	bin := buildAirlock(t)
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
