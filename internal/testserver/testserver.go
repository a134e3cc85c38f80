// Package testserver builds the airlock binary and runs `airlock serve` for
// end-to-end tests: one implementation for every package that drives a
// real server (server, mcp, e2b).
package testserver

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// build is one build of the airlock binary, made once per test binary.
type build struct {
	once sync.Once
	dir  string
	path string
	err  error
}

var (
	plain build
	kube  build // -tags kubernetes
)

// TestStamp is the build stamp (github.com/airlock-dev/airlock/agent.stampOverride) of the
// binaries Binary builds.
const TestStamp = "airlock-test-build"

// Binary builds the airlock binary (static, CGO-free) once per test binary,
// with the agent-only airlock-agent next to it, and returns its path. Call
// Cleanup from TestMain to remove them.
func Binary(t testing.TB) string {
	t.Helper()
	return plain.get(t)
}

// KubernetesBinary is Binary built with -tags kubernetes: the commands that
// need a Kubernetes client (serve --backend kubernetes, egress-proxy), which
// the default build leaves out to keep client-go's package initialisation
// out of every airlock process.
func KubernetesBinary(t testing.TB) string {
	t.Helper()
	return kube.get(t, "-tags", "kubernetes")
}

func (b *build) get(t testing.TB, flags ...string) string {
	t.Helper()
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "airlock-test-bin")
		if b.err != nil {
			return
		}
		os.Chmod(b.dir, 0o755) // unprivileged test users run it too
		b.path = filepath.Join(b.dir, "airlock")
		// The agent-only binary beside it, with the same build stamp, as
		// the README builds them: every server the tests start runs its
		// sandboxes' agents from it (the wasm runtime's from airlock).
		flags = append(flags, "-ldflags", "-X github.com/airlock-dev/airlock/agent.stampOverride="+TestStamp)
		args := append(append([]string{"build"}, flags...), "-o", b.dir+"/", "github.com/airlock-dev/airlock/cmd/airlock", "github.com/airlock-dev/airlock/cmd/airlock-agent")
		cmd := exec.Command("go", args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Cleanup removes the binaries Binary and KubernetesBinary built; call it
// from TestMain.
func Cleanup() {
	for _, b := range []*build{&plain, &kube} {
		if b.dir != "" {
			os.RemoveAll(b.dir)
		}
	}
}

// NeedRoot skips t unless it runs as root (cgroups, uid ranges). CI runs as root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, uid ranges); CI runs as root")
	}
}

// StateDir returns a fresh, short state directory (agent socket paths must
// fit in 108 bytes), removed when t ends.
func StateDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "al")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// Server is a running `airlock serve`.
type Server struct {
	URL   string // http://127.0.0.1:PORT
	State string // its state directory
	Log   string // its stderr, a file in State
	cmd   *exec.Cmd
	done  chan struct{}
}

var listening = regexp.MustCompile(`listening on (https?://\S+)`)

// Start runs `airlock serve --listen 127.0.0.1:0 --state-dir state ARGS...`,
// waits until it listens, and stops it (SIGTERM) when t ends, printing its
// log if t failed.
func Start(t testing.TB, state string, args ...string) *Server {
	t.Helper()
	return StartBinary(t, Binary(t), state, args...)
}

// StartBinary is Start with another airlock binary, bin.
func StartBinary(t testing.TB, bin, state string, args ...string) *Server {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", state}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{State: state, Log: filepath.Join(state, "server.log"), cmd: cmd, done: make(chan struct{})}
	logf, err := os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
	}()
	go func() { cmd.Wait(); close(s.done) }()
	select {
	case s.URL = <-urlc:
	case <-s.done:
		t.Fatalf("airlock serve exited: %s", s.ReadLog())
	case <-time.After(30 * time.Second):
		t.Fatal("airlock serve did not start")
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("airlock serve log:\n%s", s.ReadLog())
		}
	})
	return s
}

// ReadLog returns what the server wrote to stderr so far.
func (s *Server) ReadLog() string {
	b, _ := os.ReadFile(s.Log)
	return string(b)
}

// Done is closed when the server process has exited.
func (s *Server) Done() <-chan struct{} { return s.done }

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Stop terminates the server gracefully (it kills its sandboxes), killing
// it after 30 seconds. Idempotent.
func (s *Server) Stop() {
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

// Crash kills the server with SIGKILL and waits for it.
func (s *Server) Crash() {
	s.cmd.Process.Kill()
	<-s.done
}

// NewKey creates an API key with `airlock keys create` in state.
func NewKey(t testing.TB, state, name string, extra ...string) string {
	t.Helper()
	out, err := exec.Command(Binary(t), append([]string{"keys", "create", "--name", name, "--state-dir", state}, extra...)...).Output()
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	return strings.TrimSpace(string(out))
}
