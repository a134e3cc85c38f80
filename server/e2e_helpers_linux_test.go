package server_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"airlock/client"
	"airlock/store"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// airlockBin builds the airlock binary once per test binary.
func airlockBin(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "airlock-e2e-bin")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "airlock")
		out, err := exec.Command("go", "build", "-o", binPath, "airlock/cmd/airlock").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, uid ranges); CI runs as root")
	}
}

// stateDir returns a short state dir (agent socket paths must fit in 108 bytes).
func stateDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "al")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// srv is a running `airlock serve`.
type srv struct {
	cmd   *exec.Cmd
	URL   string
	State string
	done  chan struct{}
}

// startServer runs airlock serve on a free loopback port.
func startServer(t testing.TB, state string, args ...string) *srv {
	t.Helper()
	bin := airlockBin(t)
	all := append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", state}, args...)
	cmd := exec.Command(bin, all...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.OpenFile(filepath.Join(state, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	s := &srv{cmd: cmd, State: state, done: make(chan struct{})}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		re := regexp.MustCompile(`listening on (http://\S+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
	}()
	go func() { cmd.Wait(); close(s.done) }()
	select {
	case s.URL = <-urlc:
	case <-s.done:
		b, _ := os.ReadFile(filepath.Join(state, "server.log"))
		t.Fatalf("airlock serve exited: %s", b)
	case <-time.After(30 * time.Second):
		t.Fatal("airlock serve did not start")
	}
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop terminates the server gracefully (it kills its sandboxes).
func (s *srv) stop(t testing.TB) {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// crash SIGKILLs the server.
func (s *srv) crash() {
	s.cmd.Process.Kill()
	<-s.done
}

// newKey creates an API key with `airlock keys create`.
func newKey(t testing.TB, state, name string, extra ...string) string {
	t.Helper()
	args := append([]string{"keys", "create", "--name", name, "--state-dir", state}, extra...)
	out, err := exec.Command(airlockBin(t), args...).Output()
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	secret := strings.TrimSpace(string(out))
	if !strings.HasPrefix(secret, "al_") {
		t.Fatalf("keys create printed %q", secret)
	}
	return secret
}

// initPid reads a sandbox's init pid from the server's store.
func initPid(t testing.TB, state, id string) int {
	t.Helper()
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.InitPID <= 0 {
		t.Fatalf("sandbox %s has no init pid", id)
	}
	return rec.InitPID
}

// cgroupDirs lists the host cgroup directories named after id.
func cgroupDirs(id string) []string {
	var found []string
	for _, pat := range []string{"/sys/fs/cgroup/*/airlock/" + id, "/sys/fs/cgroup/airlock/" + id, "/sys/fs/cgroup/*/airlock/*/" + id} {
		m, _ := filepath.Glob(pat)
		found = append(found, m...)
	}
	return found
}

// alive reports whether pid is a live (non-zombie) process started at
// startTime (0: any).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	// A zombie has released everything; only its parent's wait is missing.
	return s[i+2] != 'Z'
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// assertGone checks from the host that nothing of a sandbox remains.
func assertGone(t testing.TB, state, id string, pid int) {
	t.Helper()
	eventually(t, 15*time.Second, "sandbox "+id+" init exits", func() bool { return !alive(pid) })
	eventually(t, 15*time.Second, "sandbox "+id+" cgroups removed", func() bool { return len(cgroupDirs(id)) == 0 })
	if _, err := os.Stat(filepath.Join(state, "sandboxes", id)); !os.IsNotExist(err) {
		t.Errorf("state dir of %s still exists (err %v)", id, err)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var _ = client.New
