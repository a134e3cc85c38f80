package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// apiServer is an `airlock serve` process started for the figures that go
// through airlock's HTTP API, and a client for it.
type apiServer struct {
	cmd     *exec.Cmd
	url     string
	dir     string
	c       *client.Client
	exited  chan struct{}
	errf    *os.File
	timeout time.Duration
}

// startServer starts `exe serve` on a free loopback port without
// authentication, with its state in a fresh directory under scratch, and
// waits until it listens.
func startServer(exe, scratch string, maxSandboxes int, timeout time.Duration, extra ...string) (*apiServer, error) {
	return startServerPrepared(exe, scratch, maxSandboxes, timeout, nil, extra...)
}

// startServerPrepared is startServer with prepare, if not nil, run on the
// server's fresh state directory before the server starts (to put images
// in its image store).
func startServerPrepared(exe, scratch string, maxSandboxes int, timeout time.Duration, prepare func(dir string) error, extra ...string) (*apiServer, error) {
	if exe == "" {
		return nil, errors.New("airlock binary unknown")
	}
	if timeout <= 0 {
		timeout = time.Minute
	}
	dir, err := os.MkdirTemp(scratch, "airlock-bench-serve-")
	if err != nil {
		return nil, err
	}
	if prepare != nil {
		if err := prepare(dir); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	errf, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(exe, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", dir, "--no-auth",
		"--max-sandboxes", strconv.Itoa(maxSandboxes), "--default-timeout", "1h"}, extra...)...)
	cmd.Stderr = errf
	out, err := cmd.StdoutPipe()
	if err != nil {
		errf.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		errf.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	s := &apiServer{cmd: cmd, dir: dir, errf: errf, exited: make(chan struct{}), timeout: timeout}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "airlock: listening on "); ok {
				urlc <- strings.TrimSpace(u)
			}
		}
		// Keep draining nothing: stdout is closed when the server exits.
	}()
	go func() { _ = cmd.Wait(); close(s.exited) }()
	select {
	case s.url = <-urlc:
	case <-s.exited:
		err := fmt.Errorf("airlock serve exited: %s: %s", cmd.ProcessState, s.log())
		s.cleanup()
		return nil, err
	case <-time.After(30 * time.Second):
		s.stop()
		return nil, errors.New("airlock serve did not listen within 30s")
	}
	s.c = client.New(s.url, "")
	return s, nil
}

// log returns the tail of the server's stderr.
func (s *apiServer) log() string {
	b, _ := os.ReadFile(s.errf.Name())
	msg := oneLine(string(b))
	if len(msg) > 300 {
		msg = "..." + msg[len(msg)-300:]
	}
	return msg
}

// stop stops the server, which kills its sandboxes, and removes its state.
func (s *apiServer) stop() {
	if s == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cleanup()
}

func (s *apiServer) cleanup() {
	s.errf.Close()
	os.RemoveAll(s.dir)
}

// ctx returns a context bounded by the per-operation timeout.
func (s *apiServer) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.timeout)
}

// peer returns the airlock peer whose sandboxes are live sandboxes of the
// server: created with POST /v1/sandboxes (strict preset, the agent as
// init) and run commands with POST /v1/sandboxes/{id}/exec.
func (s *apiServer) peer() Peer {
	return Peer{
		Name:      Reference,
		Note:      "airlock serve (loopback, no auth) and the Go client: POST /v1/sandboxes, then POST /v1/sandboxes/{id}/exec",
		IdleNote:  "a live sandbox of airlock serve (POST /v1/sandboxes, strict preset): the agent is its init, idle and ready to exec",
		ExecNote:  "POST /v1/sandboxes/{id}/exec through the Go client, end to end",
		CanExec:   true,
		StartIdle: s.startLive,
	}
}

// GVisorPeer is the name of the airlock peer whose live sandboxes run
// under the gvisor tier.
const GVisorPeer = Reference + " gvisor"

// gvisorPeer is peer with live sandboxes created with "runtime": "gvisor".
func (s *apiServer) gvisorPeer() Peer {
	p := s.peer()
	p.Name = GVisorPeer
	p.Note = "airlock serve (loopback, no auth) and the Go client: POST /v1/sandboxes {\"runtime\":\"gvisor\"}, then POST /v1/sandboxes/{id}/exec"
	p.IdleNote = "a live gvisor sandbox of airlock serve: the agent is its init under runsc, idle and ready to exec"
	p.StartIdle = func(argv []string) (*Idle, error) { return s.startLiveRuntime("gvisor") }
	return p
}

// startLive creates a live sandbox through the API. Its init is the agent,
// so argv is not used.
func (s *apiServer) startLive([]string) (*Idle, error) { return s.startLiveRuntime("") }

// startLiveRuntime creates a live sandbox of runtime ("" the server's
// default) through the API.
func (s *apiServer) startLiveRuntime(runtime string) (*Idle, error) {
	return s.startLiveImage(runtime, "")
}

// startLiveImage creates a live sandbox of runtime from image ("" the
// default root) through the API.
func (s *apiServer) startLiveImage(runtime, image string) (*Idle, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	sb, err := s.c.Create(ctx, client.CreateRequest{Runtime: runtime, Image: image})
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	id := sb.ID
	kill := func() error {
		ctx, cancel := s.ctx()
		defer cancel()
		return s.c.Kill(ctx, id)
	}
	idle := &Idle{Stop: kill}
	// Finding the sandbox's host processes scans every child of the
	// server (50 of them in a burst of 50 creates), which is the bench's
	// work, not the server's: it is left to Settle, after the timed part.
	// A gvisor sandbox's root is the `runsc run` child of the server,
	// outside the cgroup of its sentry and gofer (its descendants).
	idle.Settle = func() error {
		root, cg := s.sandboxPid(id), ""
		if runtime == "gvisor" {
			root, cg = s.runscPid(id)
		}
		if root == 0 {
			return fmt.Errorf("sandbox %s: no process of the server is in its cgroup", id)
		}
		idle.Root, idle.Cgroup = root, cg
		return nil
	}
	idle.Exec = func(argv []string) error {
		ctx, cancel := s.ctx()
		defer cancel()
		res, err := s.c.Exec(ctx, id, client.ExecRequest{Argv: argv})
		if err != nil {
			return err
		}
		if res.Status != "ok" || res.ExitCode != 0 {
			return fmt.Errorf("exec %s: status %s, exit code %d: %s", strings.Join(argv, " "), res.Status, res.ExitCode, oneLine(res.Stderr))
		}
		return nil
	}
	return idle, nil
}

// sandboxPid finds the init process of sandbox id: a child of the server
// whose memory cgroup is the sandbox's or a child group of it.
func (s *apiServer) sandboxPid(id string) int {
	kids, ok := children(s.cmd.Process.Pid)
	if !ok {
		kids = processTree()[s.cmd.Process.Pid]
	}
	for _, pid := range kids {
		// The agent's threads live in the sandbox's group and its spawner
		// thread in the workload's child group (sandbox/workload), so the
		// main thread may be in either.
		cg := memCgroup(pid)
		if filepath.Base(cg) == id || filepath.Base(filepath.Dir(cg)) == id {
			return pid
		}
	}
	return 0
}

// runscPid finds the `runsc run` process of gvisor sandbox id, a child of
// the server, and the memory cgroup of its sentry and gofer (named after
// the sandbox).
func (s *apiServer) runscPid(id string) (int, string) {
	kids, ok := children(s.cmd.Process.Pid)
	if !ok {
		kids = processTree()[s.cmd.Process.Pid]
	}
	for _, pid := range kids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if !strings.Contains(string(b), "\x00"+id+"\x00") {
			continue
		}
		for _, d := range descendants(pid) {
			if cg := memCgroup(d); filepath.Base(cg) == id {
				return pid, cg
			}
		}
	}
	return 0, ""
}
