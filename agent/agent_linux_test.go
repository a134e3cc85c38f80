package agent_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/agent"
)

const childEnv = "AIRLOCK_AGENT_TEST_CHILD"

// raceEnabled is set under the race detector, which inflates memory use.
var raceEnabled bool

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		agent.Main()
		return
	}
	os.Exit(m.Run())
}

// testAgent is an agent running as a child process of the test.
type testAgent struct {
	cmd    *exec.Cmd
	conn   net.Conn
	c      *agent.Client
	home   string
	exited chan struct{}
}

// spawnAgent starts the agent (this test binary re-executed) on one end of a
// socketpair and returns the other end.
func spawnAgent(t testing.TB) (*exec.Cmd, net.Conn, chan struct{}) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostF := os.NewFile(uintptr(fds[0]), "host")
	childF := os.NewFile(uintptr(fds[1]), "agent")
	// AIRLOCK_AGENT_BIN runs another binary's agent instead (e.g. a built
	// airlock, to measure the real footprint): BIN __agent.
	cmd := exec.Command(os.Args[0])
	if bin := os.Getenv("AIRLOCK_AGENT_BIN"); bin != "" {
		cmd = exec.Command(bin, "__agent")
	}
	cmd.Stdin = childF
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), childEnv+"=1", "LC_ALL=C")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	childF.Close()
	conn, err := net.FileConn(hostF)
	hostF.Close()
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		conn.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Errorf("agent did not exit after the connection closed")
		}
	})
	return cmd, conn, exited
}

func startAgent(t testing.TB) *testAgent {
	t.Helper()
	cmd, conn, exited := spawnAgent(t)
	home := t.TempDir()
	c, err := agent.NewClientConfig(conn, agent.Config{Home: home})
	if err != nil {
		t.Fatal(err)
	}
	return &testAgent{cmd: cmd, conn: conn, c: c, home: home, exited: exited}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func run(t *testing.T, c *agent.Client, req agent.ExecRequest) (string, string, agent.ExitStatus) {
	t.Helper()
	ctx := ctxT(t)
	p, err := c.Exec(ctx, req)
	if err != nil {
		t.Fatalf("exec %v: %v", req, err)
	}
	defer p.Close()
	out, errb, trunc, st, err := p.Collect(ctx, 1<<20)
	if err != nil || trunc {
		t.Fatalf("collect %v: %v (truncated %v)", req, err, trunc)
	}
	return string(out), string(errb), st
}

func TestExecEcho(t *testing.T) {
	ta := startAgent(t)
	out, _, st := run(t, ta.c, agent.ExecRequest{Argv: []string{"echo", "hello", "world"}})
	if out != "hello world\n" || st.Code != 0 || st.Signal != "" {
		t.Fatalf("got %q %+v", out, st)
	}
	_, _, st = run(t, ta.c, agent.ExecRequest{Shell: "exit 3"})
	if st.Code != 3 {
		t.Fatalf("exit 3: got %+v", st)
	}
	out, _, _ = run(t, ta.c, agent.ExecRequest{Shell: "pwd; echo $FOO", Env: []string{"FOO=bar"}})
	if out != ta.home+"\nbar\n" {
		t.Fatalf("cwd/env: got %q", out)
	}
	os.Mkdir(filepath.Join(ta.home, "sub"), 0o755)
	out, _, _ = run(t, ta.c, agent.ExecRequest{Argv: []string{"pwd"}, Cwd: "sub"})
	if out != filepath.Join(ta.home, "sub")+"\n" {
		t.Fatalf("relative cwd: got %q", out)
	}
	_, err := ta.c.Exec(ctxT(t), agent.ExecRequest{Argv: []string{"no-such-program-xyz"}})
	if !errors.Is(err, &agent.Error{Code: agent.CodeNotFound}) {
		t.Fatalf("missing program: %v", err)
	}
	_, err = ta.c.Exec(ctxT(t), agent.ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing cwd: %v", err)
	}
	_, err = ta.c.Exec(ctxT(t), agent.ExecRequest{})
	if !errors.Is(err, &agent.Error{Code: agent.CodeInvalidArgument}) {
		t.Fatalf("empty request: %v", err)
	}
	if err := ta.c.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// Children get fds 0, 1 and 2 only (3 is ls's own directory).
	out, _, _ = run(t, ta.c, agent.ExecRequest{Argv: []string{"ls", "/proc/self/fd"}})
	if strings.Fields(out)[0] != "0" || len(strings.Fields(out)) != 4 {
		t.Fatalf("child fds: %q", out)
	}
	// Signal dispositions are the defaults, not the agent's.
	out, _, _ = run(t, ta.c, agent.ExecRequest{Shell: "grep -E 'Sig(Ign|Blk)' /proc/self/status"})
	if !strings.Contains(out, "SigIgn:\t0000000000000000") || !strings.Contains(out, "SigBlk:\t0000000000000000") {
		t.Fatalf("child signal state: %q", out)
	}
}

func TestSigtermShutsDown(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)
	p, err := ta.c.Exec(ctx, agent.ExecRequest{Argv: []string{"sleep", "100"}, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	ta.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ta.exited:
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not exit on SIGTERM")
	}
	waitGone(t, p.Pid)
	if code := ta.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("agent exit code %d", code)
	}
}

func TestStdoutStderr(t *testing.T) {
	ta := startAgent(t)
	out, errb, st := run(t, ta.c, agent.ExecRequest{Shell: "echo out; echo err >&2; echo out2; exit 1"})
	if out != "out\nout2\n" || errb != "err\n" || st.Code != 1 {
		t.Fatalf("got %q %q %+v", out, errb, st)
	}
}

// A descendant that keeps stdout open must not hold back the exit; output
// written after the exit still reaches the ring for Attach.
func TestExitWithInheritedPipes(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)
	start := time.Now()
	p, err := ta.c.Exec(ctx, agent.ExecRequest{Shell: "(sleep 0.5; echo late) & echo early", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	out, _, _, st, err := p.Collect(ctx, 100)
	if err != nil || string(out) != "early\n" || st.Code != 0 {
		t.Fatalf("got %q %+v %v", out, st, err)
	}
	if d := time.Since(start); d > 400*time.Millisecond {
		t.Fatalf("exit took %v", d)
	}
	time.Sleep(700 * time.Millisecond)
	a, err := ta.c.Attach(ctx, p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	out, _, _, _, err = a.Collect(ctx, 100)
	if err != nil || string(out) != "early\nlate\n" {
		t.Fatalf("replay %q %v", out, err)
	}
}

func TestConcurrentExec(t *testing.T) {
	ta := startAgent(t)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, _, st := run(t, ta.c, agent.ExecRequest{Argv: []string{"echo", strconv.Itoa(i)}})
			if out != strconv.Itoa(i)+"\n" || st.Code != 0 {
				t.Errorf("%d: got %q %+v", i, out, st)
			}
		}()
	}
	wg.Wait()
}

// procStatus returns a field of /proc/<pid>/status in kB.
func procStatusKB(t testing.TB, pid int, field string) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	t.Fatalf("no %s in status of %d", field, pid)
	return 0
}

func TestBigOutputSlowReader(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)
	pid := ta.cmd.Process.Pid
	base := procStatusKB(t, pid, "VmRSS")
	const total = 50 << 20
	p, err := ta.c.Exec(ctx, agent.ExecRequest{Shell: fmt.Sprintf("head -c %d /dev/zero; echo done >&2", total)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Do not read for a while: the agent must stop reading the pipe
	// rather than buffer.
	time.Sleep(500 * time.Millisecond)
	stalled := procStatusKB(t, pid, "VmRSS")
	// Other streams still work while this one is stalled.
	if err := ta.c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if out, _, _ := run(t, ta.c, agent.ExecRequest{Argv: []string{"echo", "other"}}); out != "other\n" {
		t.Fatalf("other exec while stalled: %q", out)
	}
	var got int
	maxRSS := stalled
	var stderr string
	for ev := range p.Events() {
		switch ev.Type {
		case agent.EventStdout:
			got += len(ev.Data)
			if got%(5<<20) < len(ev.Data) {
				time.Sleep(20 * time.Millisecond) // slow consumer
				maxRSS = max(maxRSS, procStatusKB(t, pid, "VmRSS"))
			}
		case agent.EventStderr:
			stderr += string(ev.Data)
		case agent.EventExit:
			if ev.ExitCode != 0 {
				t.Fatalf("exit %+v", ev)
			}
		}
	}
	if got != total || stderr != "done\n" {
		t.Fatalf("got %d bytes, stderr %q", got, stderr)
	}
	t.Logf("agent VmRSS: idle %d kB, stalled %d kB, max while streaming %d kB", base, stalled, maxRSS)
	if maxRSS-base > 16<<10 && !raceEnabled {
		t.Fatalf("agent RSS grew by %d kB while streaming 50 MB", maxRSS-base)
	}
}

func TestBackgroundAttach(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)
	marker := filepath.Join(ta.home, "go")
	p, err := ta.c.Exec(ctx, agent.ExecRequest{
		Shell:      fmt.Sprintf("echo start; while [ ! -e %s ]; do sleep 0.01; done; echo end >&2; exit 7", marker),
		Tag:        "bg-job",
		Background: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	pid := p.Pid
	p.Close() // detach: a background process keeps running
	time.Sleep(50 * time.Millisecond)
	procs, err := ta.c.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var found *agent.ProcessInfo
	for i := range procs {
		if procs[i].Pid == pid {
			found = &procs[i]
		}
	}
	if found == nil || !found.Running || found.Tag != "bg-job" || !found.Background || found.Argv[0] != "/bin/sh" {
		t.Fatalf("process list %+v", procs)
	}
	a, err := ta.c.Attach(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	first := <-a.Events()
	if first.Type != agent.EventStdout || string(first.Data) != "start\n" {
		t.Fatalf("replay: %+v", first)
	}
	os.WriteFile(marker, nil, 0o644)
	out, errb, _, st, err := a.Collect(ctx, 1<<20)
	if err != nil || string(out) != "" || string(errb) != "end\n" || st.Code != 7 {
		t.Fatalf("follow: %q %q %+v %v", out, errb, st, err)
	}
	// An exited background process is retained: attach replays everything.
	a2, err := ta.c.Attach(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	out, errb, _, st, err = a2.Collect(ctx, 1<<20)
	if err != nil || string(out) != "start\n" || string(errb) != "end\n" || st.Code != 7 {
		t.Fatalf("replay after exit: %q %q %+v %v", out, errb, st, err)
	}
	procs, _ = ta.c.Processes(ctx)
	if len(procs) != 1 || procs[0].Running || procs[0].ExitCode != 7 || procs[0].ExitedAt.IsZero() {
		t.Fatalf("after exit: %+v", procs)
	}
	if _, err := ta.c.Attach(ctx, 999999); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("attach to unknown pid: %v", err)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	return !strings.HasPrefix(s[strings.LastIndexByte(s, ')')+2:], "Z")
}

// waitComm waits until process pid runs the named program.
func waitComm(t *testing.T, pid int, name string) {
	t.Helper()
	for range 500 {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(b)) == name {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("process %d never ran %s", pid, name)
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for i := 0; i < 500 && alive(pid); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(pid) {
		t.Fatalf("process %d still alive", pid)
	}
}

func TestForegroundKilledOnClose(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)
	p, err := ta.c.Exec(ctx, agent.ExecRequest{Shell: "sleep 100 & echo $!; wait"})
	if err != nil {
		t.Fatal(err)
	}
	ev := <-p.Events()
	sleepPid, _ := strconv.Atoi(strings.TrimSpace(string(ev.Data)))
	if !alive(p.Pid) || !alive(sleepPid) {
		t.Fatal("not running")
	}
	p.Close()
	waitGone(t, p.Pid)
	waitGone(t, sleepPid)
	if _, err := p.Wait(ctx); !errors.Is(err, agent.ErrDetached) {
		t.Fatalf("wait after close: %v", err)
	}
}

func TestStdinStreaming(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)
	p, err := ta.c.Exec(ctx, agent.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("hello "), StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	ev := <-p.Events()
	if string(ev.Data) != "hello " {
		t.Fatalf("first chunk %+v", ev)
	}
	if err := p.WriteStdin(ctx, []byte("world"), false); err != nil {
		t.Fatal(err)
	}
	if err := ta.c.WriteStdin(ctx, p.Pid, []byte("!"), true); err != nil {
		t.Fatal(err)
	}
	out, _, _, st, err := p.Collect(ctx, 100)
	if err != nil || string(out) != "world!" || st.Code != 0 {
		t.Fatalf("got %q %+v %v", out, st, err)
	}
	// Without StdinOpen, stdin is closed after Stdin; with no Stdin at all
	// the process sees EOF at once.
	out2, _, _ := run(t, ta.c, agent.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("abc")})
	out3, _, _ := run(t, ta.c, agent.ExecRequest{Argv: []string{"cat"}})
	if out2 != "abc" || out3 != "" {
		t.Fatalf("got %q %q", out2, out3)
	}
	if err := ta.c.WriteStdin(ctx, p.Pid, []byte("x"), false); err == nil {
		t.Fatal("stdin write to exited process succeeded")
	}

	// Several MB both ways, more than every window and pipe buffer.
	big := make([]byte, 5<<20)
	rand.Read(big)
	p, err = ta.c.Exec(ctx, agent.ExecRequest{Argv: []string{"cat"}, Stdin: big})
	if err != nil {
		t.Fatal(err)
	}
	out, _, _, st, err = p.Collect(ctx, 10<<20)
	if err != nil || !bytes.Equal(out, big) || st.Code != 0 {
		t.Fatalf("big cat: %d bytes, %+v, %v", len(out), st, err)
	}
}

func TestSignals(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)
	p, err := ta.c.Exec(ctx, agent.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ta.c.Signal(ctx, p.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	if err != nil || st.Signal != "SIGTERM" || st.Code != 128+15 {
		t.Fatalf("got %+v %v", st, err)
	}
	// The whole process group gets the signal.
	p, err = ta.c.Exec(ctx, agent.ExecRequest{Shell: "trap 'echo got-term; exit 5' TERM; sleep 100 & echo $!; wait"})
	if err != nil {
		t.Fatal(err)
	}
	ev := <-p.Events()
	sleepPid, _ := strconv.Atoi(strings.TrimSpace(string(ev.Data)))
	waitComm(t, sleepPid, "sleep") // until exec, the forked shell has the trap
	if err := p.Signal(ctx, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	out, _, _, st, err := p.Collect(ctx, 100)
	if err != nil || string(out) != "got-term\n" || st.Code != 5 {
		t.Fatalf("got %q %+v %v", out, st, err)
	}
	waitGone(t, sleepPid)
	if err := ta.c.Signal(ctx, 999999, syscall.SIGTERM); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("signal unknown pid: %v", err)
	}
}

// children returns the pids whose parent is pid, with their states.
func children(pid int) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			out[n] = f[0]
		}
	}
	return out
}

func TestZombieReaping(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)
	apid := ta.cmd.Process.Pid
	// Double fork: the grandchildren are orphaned and reparented to the
	// agent. They leave the exec's process group (setsid), or they would
	// be killed with it when the exec ends; each reports its pid through a
	// FIFO only once it is in its own session, so the exec cannot end (and
	// kill its group) while one is still between fork and setsid.
	out, _, st := run(t, ta.c, agent.ExecRequest{Shell: `d=$(mktemp -d); for i in 1 2 3; do mkfifo $d/f$i; (setsid sh -c "echo \$\$ > $d/f$i; exec sleep 0.3" &); cat $d/f$i; done; rm -rf $d`})
	if st.Code != 0 {
		t.Fatal(st)
	}
	pids := strings.Fields(out)
	if len(pids) != 3 {
		t.Fatalf("output %q", out)
	}
	kids := children(apid)
	for _, s := range pids {
		n, _ := strconv.Atoi(s)
		if _, ok := kids[n]; !ok {
			t.Fatalf("orphan %d not reparented to agent %d: %v", n, apid, kids)
		}
	}
	time.Sleep(700 * time.Millisecond)
	for pid, state := range children(apid) {
		t.Errorf("agent still has child %d in state %s", pid, state)
	}
	if err := ta.c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCloseKillsChildren(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)
	p, err := ta.c.Exec(ctx, agent.ExecRequest{Shell: "setsid sleep 100 & echo $!; sleep 100", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	ev := <-p.Events()
	other, _ := strconv.Atoi(strings.TrimSpace(string(ev.Data)))
	time.Sleep(20 * time.Millisecond)
	if !alive(p.Pid) || !alive(other) {
		t.Fatal("not running")
	}
	ta.c.Close()
	select {
	case <-ta.exited:
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not exit")
	}
	waitGone(t, p.Pid)
	waitGone(t, other) // in another session and process group
	if err := ta.c.Ping(ctx); !errors.Is(err, agent.ErrClosed) {
		t.Fatalf("ping after close: %v", err)
	}
}

func TestFileOps(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)
	c := ta.c
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	n, err := c.WriteFile(ctx, "a/b/c.bin", bytes.NewReader(data), 0o600)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d %v", n, err)
	}
	fi, err := c.Stat(ctx, "a/b/c.bin")
	if err != nil {
		t.Fatal(err)
	}
	abs := filepath.Join(ta.home, "a/b/c.bin")
	if fi.Type != agent.TypeFile || fi.Size != int64(len(data)) || fi.Mode != 0o600 || fi.Path != abs || fi.Name != "c.bin" {
		t.Fatalf("stat %+v", fi)
	}
	if time.Since(fi.ModTime) > time.Minute {
		t.Fatalf("mtime %v", fi.ModTime)
	}
	r, err := c.ReadFile(ctx, abs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	// Overwrite with less: truncated, mode kept.
	if _, err := c.WriteFile(ctx, "a/b/c.bin", strings.NewReader("short"), 0); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(abs); string(b) != "short" {
		t.Fatalf("overwrite: %q", b)
	}
	if fi, _ := c.Stat(ctx, "a/b/c.bin"); fi.Mode != 0o600 {
		t.Fatalf("mode after overwrite %v", fi.Mode)
	}
	// An early close of a reader does not disturb the connection.
	r, _ = c.ReadFile(ctx, "a/b/c.bin")
	r.Close()

	if err := c.Mkdir(ctx, "d1/d2/d3"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ta.home, "d1/d2/f"), []byte("x"), 0o644)
	os.Symlink("../a", filepath.Join(ta.home, "d1/link"))
	if err := c.Mkdir(ctx, "d1/d2/f/x"); !errors.Is(err, &agent.Error{Code: agent.CodeNotADirectory}) {
		t.Fatalf("mkdir under a file: %v", err)
	}
	l1, err := c.List(ctx, "d1", 1)
	if err != nil {
		t.Fatal(err)
	}
	if names(l1) != "d2 link" || l1[1].Type != agent.TypeSymlink || l1[1].Target != "../a" || l1[0].Type != agent.TypeDir {
		t.Fatalf("depth 1: %+v", l1)
	}
	l3, err := c.List(ctx, "d1", 3)
	if err != nil {
		t.Fatal(err)
	}
	if names(l3) != "d2 d3 f link" || l3[1].Path != filepath.Join(ta.home, "d1/d2/d3") {
		t.Fatalf("depth 3: %+v", l3)
	}
	if _, err := c.List(ctx, "a/b/c.bin", 1); !errors.Is(err, &agent.Error{Code: agent.CodeNotADirectory}) {
		t.Fatalf("list a file: %v", err)
	}
	if err := c.Move(ctx, "d1", "moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ta.home, "moved/d2/f")); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, "moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ta.home, "moved")); !os.IsNotExist(err) {
		t.Fatalf("after remove: %v", err)
	}
	for name, err := range map[string]error{
		"stat":   func() error { _, err := c.Stat(ctx, "nope"); return err }(),
		"read":   func() error { _, err := c.ReadFile(ctx, "nope"); return err }(),
		"remove": c.Remove(ctx, "nope"),
		"move":   c.Move(ctx, "nope", "nope2"),
		"list":   func() error { _, err := c.List(ctx, "nope", 1); return err }(),
	} {
		var ae *agent.Error
		if !errors.As(err, &ae) || ae.Code != agent.CodeNotFound {
			t.Errorf("%s of a missing path: %v", name, err)
		}
	}
	if _, err := c.ReadFile(ctx, "a"); !errors.Is(err, &agent.Error{Code: agent.CodeIsADirectory}) {
		t.Fatalf("read a directory: %v", err)
	}
	if err := c.Remove(ctx, "/"); !errors.Is(err, &agent.Error{Code: agent.CodeInvalidArgument}) {
		t.Fatalf("remove /: %v", err)
	}
	if _, err := c.Stat(ctx, ""); !errors.Is(err, &agent.Error{Code: agent.CodeInvalidArgument}) {
		t.Fatalf("stat empty: %v", err)
	}
}

func names(fis []agent.FileInfo) string {
	var s []string
	for _, fi := range fis {
		s = append(s, fi.Name)
	}
	return strings.Join(s, " ")
}

func TestNonRegularRefused(t *testing.T) {
	ta := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fifo := filepath.Join(ta.home, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.c.ReadFile(ctx, "fifo"); !errors.Is(err, &agent.Error{Code: agent.CodeNotRegular}) {
		t.Fatalf("read fifo: %v", err)
	}
	if _, err := ta.c.WriteFile(ctx, "fifo", strings.NewReader("x"), 0); !errors.Is(err, &agent.Error{Code: agent.CodeNotRegular}) {
		t.Fatalf("write fifo: %v", err)
	}
	if _, err := ta.c.ReadFile(ctx, "/dev/null"); !errors.Is(err, &agent.Error{Code: agent.CodeNotRegular}) {
		t.Fatalf("read /dev/null: %v", err)
	}
	if _, err := ta.c.WriteFile(ctx, "/dev/null", strings.NewReader("x"), 0); !errors.Is(err, &agent.Error{Code: agent.CodeNotRegular}) {
		t.Fatalf("write /dev/null: %v", err)
	}
	fi, err := ta.c.Stat(ctx, "fifo")
	if err != nil || fi.Type != agent.TypeOther {
		t.Fatalf("stat fifo: %+v %v", fi, err)
	}
	// /proc files report size 0 but have content.
	r, err := ta.c.ReadFile(ctx, "/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	if !bytes.Contains(b, []byte("Pid:")) {
		t.Fatalf("/proc/self/status: %q", b)
	}
}

func TestUnknownFrameType(t *testing.T) {
	_, conn, _ := spawnAgent(t)
	conn.Write(agent.AppendFrame(nil, agent.FrameHello, 0, []byte(`{"version":1}`)))
	f, err := agent.ReadFrame(conn)
	if err != nil || f.Type != agent.FrameHello {
		t.Fatalf("hello: %+v %v", f, err)
	}
	conn.Write(agent.AppendFrame(nil, agent.FrameType(0x3f), 7, []byte(`{}`)))
	conn.Write(agent.AppendFrame(nil, agent.FrameExec, 9, []byte(`{"argv":["true"],"bogus":1}`)))
	conn.Write(agent.AppendFrame(nil, agent.FramePing, 11, []byte(`{}`)))
	want := map[uint32]string{7: "unsupported", 9: "invalid_argument", 11: "result"}
	for range 3 {
		f, err := agent.ReadFrame(conn)
		if err != nil {
			t.Fatal(err)
		}
		w := want[f.Stream]
		if w == "result" && f.Type == agent.FrameResult || f.Type == agent.FrameError && strings.Contains(string(f.Payload), `"`+w+`"`) {
			delete(want, f.Stream)
			continue
		}
		t.Fatalf("unexpected %s on %d: %s", f.Type, f.Stream, f.Payload)
	}
}

func TestBadHello(t *testing.T) {
	_, conn, exited := spawnAgent(t)
	conn.Write(agent.AppendFrame(nil, agent.FrameHello, 0, []byte(`{"version":99}`)))
	f, err := agent.ReadFrame(conn)
	if err != nil || f.Type != agent.FrameError {
		t.Fatalf("got %+v %v", f, err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not exit after a bad hello")
	}
}

// fakeAgent answers the hello and then runs script on the raw connection.
func fakeAgent(t *testing.T, script func(conn net.Conn)) *agent.Client {
	t.Helper()
	host, ag := net.Pipe()
	go func() {
		defer ag.Close()
		if _, err := agent.ReadFrame(ag); err != nil {
			return
		}
		ag.Write(agent.AppendFrame(nil, agent.FrameHello, 0, []byte(`{"version":1,"pid":1}`)))
		script(ag)
	}()
	c, err := agent.NewClient(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestHostileAgent(t *testing.T) {
	ctx := ctxT(t)
	// Output beyond the granted credit closes the connection.
	c := fakeAgent(t, func(conn net.Conn) {
		f, _ := agent.ReadFrame(conn)
		conn.Write(agent.AppendFrame(nil, agent.FrameStarted, f.Stream, []byte(`{"pid":5}`)))
		chunk := make([]byte, 64<<10)
		for range 10 {
			if _, err := conn.Write(agent.AppendFrame(nil, agent.FrameStdout, f.Stream, chunk)); err != nil {
				return
			}
		}
		io.Copy(io.Discard, conn)
	})
	p, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the flood arrive without reading
	if _, err := p.Wait(ctx); !errors.Is(err, agent.ErrProtocol) {
		t.Fatalf("credit violation: %v", err)
	}
	if !errors.Is(c.Err(), agent.ErrClosed) {
		t.Fatalf("connection not closed: %v", c.Err())
	}

	// An oversized frame header closes the connection.
	c = fakeAgent(t, func(conn net.Conn) {
		agent.ReadFrame(conn)
		conn.Write([]byte{byte(agent.FrameResult), 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
		io.Copy(io.Discard, conn)
	})
	if err := c.Ping(ctx); !errors.Is(err, agent.ErrFrameTooLarge) {
		t.Fatalf("huge frame: %v", err)
	}

	// Malformed JSON and unknown fields fail the request, not the client.
	c = fakeAgent(t, func(conn net.Conn) {
		for _, reply := range []string{`{"name":"x","evil":1}`, `{"name":`, `{"code":"x","message":"` + strings.Repeat("m", 10000) + `"}`} {
			f, err := agent.ReadFrame(conn)
			if err != nil {
				return
			}
			typ := agent.FrameResult
			if strings.HasPrefix(reply, `{"code"`) {
				typ = agent.FrameError
			}
			conn.Write(agent.AppendFrame(nil, typ, f.Stream, []byte(reply)))
		}
		io.Copy(io.Discard, conn)
	})
	if _, err := c.Stat(ctx, "x"); !errors.Is(err, agent.ErrProtocol) {
		t.Fatalf("unknown field: %v", err)
	}
	if _, err := c.Stat(ctx, "x"); !errors.Is(err, agent.ErrProtocol) {
		t.Fatalf("truncated json: %v", err)
	}
	var ae *agent.Error
	if _, err := c.Stat(ctx, "x"); !errors.As(err, &ae) || len(ae.Message) > 5000 {
		t.Fatalf("long error: %v", err)
	}
	// A silent agent: ctx bounds the wait.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := c.Ping(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("silent agent: %v", err)
	}
}

// smapsRollup returns the kB fields of /proc/<pid>/smaps_rollup.
func smapsRollup(pid int) map[string]int {
	out := map[string]int{}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			n, _ := strconv.Atoi(f[1])
			out[strings.TrimSuffix(f[0], ":")] = n
		}
	}
	return out
}

// TestIdleFootprint measures idle agents after one ping and one exec. Ten
// run at once, so that Pss shares the binary's pages as thousands of
// agents on one host would; Anonymous is what each agent costs on its own.
func TestIdleFootprint(t *testing.T) {
	const n = 10
	var tas []*testAgent
	for range n {
		ta := startAgent(t)
		if err := ta.c.Ping(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		run(t, ta.c, agent.ExecRequest{Argv: []string{"true"}})
		tas = append(tas, ta)
	}
	time.Sleep(300 * time.Millisecond)
	var rss, pss, anon, threads int
	for _, ta := range tas {
		m := smapsRollup(ta.cmd.Process.Pid)
		rss += m["Rss"]
		pss += m["Pss"]
		anon += m["Anonymous"]
		threads += procStatusKB(t, ta.cmd.Process.Pid, "Threads")
	}
	bin := os.Getenv("AIRLOCK_AGENT_BIN")
	if bin == "" {
		bin = "test binary"
	}
	t.Logf("idle agent (%s), mean of %d: Rss %d kB, Pss %d kB, Anonymous %d kB, %d threads",
		bin, n, rss/n, pss/n, anon/n, threads/n)
	if anon/n > 3<<10 && !raceEnabled {
		t.Errorf("idle agent has %d kB of anonymous memory, want < 3 MiB", anon/n)
	}
}

func BenchmarkPing(b *testing.B) {
	ta := startAgent(b)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if err := ta.c.Ping(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPingParallel(b *testing.B) {
	ta := startAgent(b)
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := ta.c.Ping(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkExecTrue(b *testing.B) {
	ta := startAgent(b)
	ctx := context.Background()
	req := agent.ExecRequest{Argv: []string{"/bin/true"}}
	for b.Loop() {
		p, err := ta.c.Exec(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
			b.Fatal(st, err)
		}
	}
}

func BenchmarkExecEcho(b *testing.B) {
	ta := startAgent(b)
	ctx := context.Background()
	req := agent.ExecRequest{Argv: []string{"/bin/echo", "hello"}}
	for b.Loop() {
		p, err := ta.c.Exec(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		out, _, _, _, err := p.Collect(ctx, 1024)
		if err != nil || string(out) != "hello\n" {
			b.Fatal(string(out), err)
		}
	}
}

// BenchmarkForkExecBaseline is the floor for BenchmarkExecTrue: fork, exec
// and wait for /bin/true directly from the test process.
func BenchmarkForkExecBaseline(b *testing.B) {
	for b.Loop() {
		pid, err := syscall.ForkExec("/bin/true", []string{"/bin/true"}, &syscall.ProcAttr{})
		if err != nil {
			b.Fatal(err)
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func TestListeningReconnect(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	lf, err := ln.File()
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "__agent", "--grace", "700ms")
	cmd.Stdin = lf
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), childEnv+"=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	ctx := ctxT(t)
	home := t.TempDir()
	dial := func() *agent.Client {
		t.Helper()
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		c, err := agent.NewClientConfig(conn, agent.Config{Home: home})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1 := dial()
	bg, err := c1.Exec(ctx, agent.ExecRequest{Shell: "echo bg-out; exec sleep 100", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	fg, err := c1.Exec(ctx, agent.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	c1.Close()
	waitGone(t, fg.Pid) // foreground processes die with their connection
	if !alive(bg.Pid) {
		t.Fatal("background process died with the connection")
	}
	c2 := dial()
	var procs []agent.ProcessInfo
	for range 200 { // the killed foreground process is reaped and forgotten
		if procs, err = c2.Processes(ctx); err != nil || len(procs) == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil || len(procs) != 1 || procs[0].Pid != bg.Pid || !procs[0].Running {
		t.Fatalf("processes after reconnect: %+v %v", procs, err)
	}
	a, err := c2.Attach(ctx, bg.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-a.Events(); string(ev.Data) != "bg-out\n" {
		t.Fatalf("replay %+v", ev)
	}
	// A new connection replaces the current one.
	c3 := dial()
	select {
	case <-c2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("old connection not closed")
	}
	if err := c3.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if !alive(bg.Pid) {
		t.Fatal("background process died")
	}
	c3.Close()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not exit after the grace period")
	}
	waitGone(t, bg.Pid)
}
