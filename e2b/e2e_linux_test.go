package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// sdkRuns are the runs of the scenario: the e2b release it drives (the
// package names in tests/js/package.json; older releases are npm aliases)
// and the server's --default-runtime. Every release runs on native; the
// newest also on gvisor (where runsc is installed), to keep CI time down.
var sdkRuns = []struct{ name, pkg, runtime string }{
	{"e2b-2.51.0", "e2b", "native"},
	{"e2b-2.45.0", "e2b-2-45", "native"},
	{"e2b-2.39.0", "e2b-2-39", "native"},
	{"e2b-2.51.0-gvisor", "e2b", "gvisor"},
}

// TestE2BSDKScenario runs tests/js/e2b-scenario.mjs, which drives the
// official e2b and @e2b/code-interpreter npm packages, against a real
// `airlock serve`, with nothing but E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY pointing the SDKs at it, once for each run in sdkRuns, on a
// server whose --default-runtime is the run's runtime (E2B_RUNTIME tells
// the scenario which, for the steps it skips by name on gvisor; see
// docs/gvisor.md). The key is given in its E2B form (airlock keys create
// --e2b) with the SDKs' key validation on, as users run them.
func TestE2BSDKScenario(t *testing.T) {
	testserver.NeedRoot(t)
	jsDir, err := filepath.Abs("../tests/js")
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"e2b", "e2b-2-45", "e2b-2-39", "@e2b/code-interpreter"} {
		if _, err := os.Stat(filepath.Join(jsDir, "node_modules", pkg, "package.json")); err != nil {
			t.Skipf("tests/js/node_modules lacks %s: run `npm ci` in tests/js (scripts/setup.sh does)", pkg)
		}
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}

	for _, runtime := range []string{"native", "gvisor"} {
		if runtime == "gvisor" {
			if _, err := gvisor.Available(); err != nil {
				t.Run("gvisor", func(t *testing.T) { t.Skipf("gvisor tier unavailable: %v", err) })
				continue
			}
		}
		// One server (and state directory) per runtime, shared by its runs.
		state := testserver.StateDir(t)
		key := testserver.NewKey(t, state, "e2b-scenario", "--e2b")
		if !regexp.MustCompile(`^e2b_[0-9a-f]+$`).MatchString(key) {
			t.Fatalf("airlock keys create --e2b printed %q, not e2b_ and hex", key)
		}
		srv := testserver.Start(t, state, "--default-runtime", runtime)
		for _, rel := range sdkRuns {
			if rel.runtime == runtime {
				t.Run(rel.name, func(t *testing.T) { runScenario(t, node, jsDir, srv.URL, key, rel.pkg, runtime) })
			}
		}
		srv.Stop()
	}
}

// runScenario runs e2b-scenario.mjs once with the e2b package pkg against
// the server at url, whose default runtime is runtime.
func runScenario(t *testing.T, node, jsDir, url, key, pkg, runtime string) {
	out, err := runScript(t, node, jsDir, "e2b-scenario.mjs", 5*time.Minute, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+key,
		"E2B_VALIDATE_API_KEY=true", "E2B_SDK_PACKAGE="+pkg, "E2B_RUNTIME="+runtime)
	if err != nil {
		t.Fatalf("e2b scenario failed: %v", err) // the server's log follows (testserver)
	}
	if m := regexp.MustCompile(`(?m)^SKIPPED: (.*)$`).FindStringSubmatch(out); m != nil {
		var skipped []string
		json.Unmarshal([]byte(m[1]), &skipped)
		for _, s := range skipped {
			t.Logf("scenario step skipped: %s", s)
		}
	}
	assertNoneRunning(t, url, key)
}

// runScript runs node on script in jsDir with env added to the
// environment, for at most d, logs its output line by line, and returns it.
func runScript(t *testing.T, node, jsDir, script string, d time.Duration, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		t.Log(line)
	}
	return buf.String(), err
}

// assertNoneRunning checks that nothing of a scenario's sandboxes is left
// running, through airlock's own API.
func assertNoneRunning(t *testing.T, url, key string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/sandboxes", nil)
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("list sandboxes: status %d, %v", resp.StatusCode, err)
	}
	if len(list) != 0 {
		t.Fatalf("sandboxes still running after the scenario: %+v", list)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}
