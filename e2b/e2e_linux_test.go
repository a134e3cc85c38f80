package e2b_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestE2BSDKScenario runs tests/js/e2b-scenario.mjs, which drives the
// official e2b and @e2b/code-interpreter npm packages, against a real
// `airlock serve`, with nothing but E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY pointing the SDKs at it.
func TestE2BSDKScenario(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, uid ranges); CI runs as root")
	}
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

	bin := filepath.Join(t.TempDir(), "airlock")
	if out, err := exec.Command("go", "build", "-o", bin, "airlock/cmd/airlock").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// Agent socket paths must fit in 108 bytes: keep the state dir short.
	state, err := os.MkdirTemp("", "al")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })

	out, err := exec.Command(bin, "keys", "create", "--name", "e2b-scenario", "--state-dir", state).Output()
	if err != nil {
		t.Fatalf("airlock keys create: %v", err)
	}
	key := strings.TrimSpace(string(out))

	url, logPath := startServe(t, bin, state)

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
		b, _ := os.ReadFile(logPath)
		t.Fatalf("e2b scenario failed: %v\nserver log:\n%s", err, b)
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

// startServe runs `airlock serve` on a free loopback port until the test
// ends and returns its URL and the path of its log.
func startServe(t *testing.T, bin, state string) (string, string) {
	t.Helper()
	logPath := filepath.Join(state, "server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--state-dir", state)
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	urlc := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`listening on (http://\S+)`)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
	}()
	select {
	case u := <-urlc:
		return u, logPath
	case <-done:
		b, _ := os.ReadFile(logPath)
		t.Fatalf("airlock serve exited: %s", b)
	case <-time.After(30 * time.Second):
		t.Fatal("airlock serve did not start")
	}
	return "", ""
}
