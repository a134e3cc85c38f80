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

	"airlock/internal/testserver"
)

// TestE2BSDKScenario runs tests/js/e2b-scenario.mjs, which drives the
// official e2b and @e2b/code-interpreter npm packages, against a real
// `airlock serve`, with nothing but E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY pointing the SDKs at it.
func TestE2BSDKScenario(t *testing.T) {
	testserver.NeedRoot(t)
	jsDir, err := filepath.Abs("../tests/js")
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"e2b", "@e2b/code-interpreter"} {
		if _, err := os.Stat(filepath.Join(jsDir, "node_modules", pkg, "package.json")); err != nil {
			t.Skipf("tests/js/node_modules lacks %s: run `npm ci` in tests/js (scripts/setup.sh does)", pkg)
		}
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}

	state := testserver.StateDir(t)
	key := testserver.NewKey(t, state, "e2b-scenario")
	srv := testserver.Start(t, state)
	url := srv.URL

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "e2b-scenario.mjs")
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+key)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		t.Log(line)
	}
	if err != nil {
		t.Fatalf("e2b scenario failed: %v", err) // the server's log follows (testserver)
	}
	if m := regexp.MustCompile(`(?m)^SKIPPED: (.*)$`).FindStringSubmatch(buf.String()); m != nil {
		var skipped []string
		json.Unmarshal([]byte(m[1]), &skipped)
		for _, s := range skipped {
			t.Logf("scenario step skipped: %s", s)
		}
	}

	// Nothing of the scenario's sandboxes may be left running.
	req, _ := http.NewRequest(http.MethodGet, url+"/v1/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Sandboxes []struct{ ID string } `json:"sandboxes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("list sandboxes: status %d, %v", resp.StatusCode, err)
	}
	if len(list.Sandboxes) != 0 {
		t.Fatalf("sandboxes still running after the scenario: %+v", list.Sandboxes)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}
