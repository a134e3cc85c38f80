package version_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/internal/version"
)

// repoRoot is the module's root (this package is internal/version).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// git runs git in the checkout and returns its trimmed output.
func git(t *testing.T, root string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
	if err != nil {
		t.Skipf("not a git checkout (git %v: %v): the VCS stamp cannot be checked", args, err)
	}
	return strings.TrimSpace(string(out))
}

// TestVersionFromVCS builds airlock as the README does (-buildvcs=true,
// no release flags) and checks that `airlock version --json` and a
// server's GET /v1/info name the checkout's commit and its time.
func TestVersionFromVCS(t *testing.T) {
	root := repoRoot(t)
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		// A git worktree's .git is a file; the Go toolchain stamps only a
		// checkout whose .git is a directory (as CI's clone).
		t.Skipf("%s/.git is not a directory (%v): the Go toolchain adds no VCS stamp here", root, err)
	}
	head := git(t, root, "rev-parse", "HEAD")
	when, err := time.Parse(time.RFC3339, git(t, root, "show", "-s", "--format=%cI", "HEAD"))
	if err != nil {
		t.Fatal(err)
	}
	dirty := git(t, root, "status", "--porcelain", "--untracked-files=no") != ""

	dir := t.TempDir()
	build := exec.Command("go", "build", "-buildvcs=true", "-o", dir+"/", "./cmd/airlock", "./cmd/airlock-agent")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "airlock")
	out, err := exec.Command(bin, "version", "--json").Output()
	if err != nil {
		t.Fatalf("airlock version --json: %v", err)
	}
	var in version.Info
	if err := json.Unmarshal(out, &in); err != nil {
		t.Fatalf("version --json: %v: %s", err, out)
	}
	if in.Commit != head {
		t.Errorf("commit %q, want HEAD %q", in.Commit, head)
	}
	got, err := time.Parse(time.RFC3339, in.Date)
	if err != nil || !got.Equal(when) {
		t.Errorf("build_date %q (%v), want the commit's time %v", in.Date, err, when)
	}
	if in.Modified != dirty {
		t.Errorf("modified %v, want %v (git status)", in.Modified, dirty)
	}
	line, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(line), "commit "+head[:12]) {
		t.Errorf("airlock version: %q %v, want the short commit %s", line, err, head[:12])
	}

	testserver.NeedRoot(t)
	srv := testserver.StartBinary(t, bin, testserver.StateDir(t), "--no-auth")
	resp, err := http.Get(srv.URL + "/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		Version   string `json:"version"`
		Commit    string `json:"commit"`
		BuildDate string `json:"build_date"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	if info.Version != in.Version || info.Commit != head || info.BuildDate != in.Date {
		t.Errorf("/v1/info %+v, want version %q commit %q build_date %q", info, in.Version, head, in.Date)
	}
}

// TestInfoString: the one-line form names the short commit and marks a
// modified tree; a build without a commit says so.
func TestInfoString(t *testing.T) {
	in := version.Info{Version: "1.2.3", Commit: "0123456789abcdef0123", Date: "2026-11-28T03:00:00Z",
		Modified: true, GoVersion: "go1.26.8", Platform: "linux/amd64"}
	want := "airlock 1.2.3 (commit 0123456789ab+modified, 2026-11-28T03:00:00Z, go1.26.8 linux/amd64)"
	if got := in.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	in = version.Info{Version: "0.1.0-dev", GoVersion: "go1.26.8", Platform: "linux/arm64"}
	if got := in.String(); got != "airlock 0.1.0-dev (commit unknown, go1.26.8 linux/arm64)" {
		t.Errorf("String() = %q", got)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}
