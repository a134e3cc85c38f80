package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/kube/agenttls"
)

// listenUID is the unprivileged identity the listening agent runs as, as it
// would in a pod with runAsNonRoot and no capabilities.
const listenUID = 61237

// listeningAgent is `airlock agent --listen` running as a real process.
type listeningAgent struct {
	addr   string
	home   string
	bundle *agenttls.Bundle
	ca     *agenttls.CA
	cmd    *exec.Cmd
	stderr *testserver.Output
}

// startListeningAgent installs the binary with install-agent into a fresh
// directory, writes a sandbox Secret's files there, and starts the agent
// as listenUID on 127.0.0.1:0.
func startListeningAgent(t *testing.T) *listeningAgent {
	t.Helper()
	return startAgentProcess(t, false)
}

// startAgentProcess is startListeningAgent; pooled starts it as a warm
// pool's pod does, with the CA certificate alone (--pool-ca), not enrolled
// (la.bundle is then the bundle to enroll it with).
func startAgentProcess(t *testing.T, pooled bool) *listeningAgent {
	t.Helper()
	testserver.NeedRoot(t)
	root, err := os.MkdirTemp("", "airlock-listen-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	os.Chmod(root, 0o755)

	// The init container's step: copy the binary, mode 0555.
	bin := filepath.Join(root, "airlock-bin", "airlock")
	os.Mkdir(filepath.Dir(bin), 0o755)
	if out, err := exec.Command(airlockBin(t), "install-agent", bin).CombinedOutput(); err != nil {
		t.Fatalf("install-agent: %v\n%s", err, out)
	}
	st, err := os.Stat(bin)
	if err != nil || st.Mode().Perm() != 0o555 {
		t.Fatalf("installed binary: %v, mode %v", err, st.Mode())
	}
	want, _ := os.ReadFile(airlockBin(t))
	if got, _ := os.ReadFile(bin); !bytes.Equal(got, want) {
		t.Fatal("installed binary differs from the original")
	}

	ca, err := agenttls.NewCA(0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ca.Issue("sb-listen", 0)
	if err != nil {
		t.Fatal(err)
	}
	tlsDir := filepath.Join(root, "airlock-tls")
	os.Mkdir(tlsDir, 0o755)
	files, mode := b.SecretData(), "--tls-dir"
	if pooled {
		files, mode = map[string][]byte{agenttls.CACertKey: ca.CertPEM()}, "--pool-ca"
	}
	for k, v := range files {
		f := filepath.Join(tlsDir, k)
		if err := os.WriteFile(f, v, 0o400); err != nil {
			t.Fatal(err)
		}
		os.Chown(f, listenUID, listenUID)
	}
	home := filepath.Join(root, "workspace")
	os.Mkdir(home, 0o755)
	os.Chown(home, listenUID, listenUID)

	cmd := exec.Command(bin, "agent", "--listen", "127.0.0.1:0", mode, tlsDir)
	cmd.Dir = home
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home, "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: listenUID, Gid: listenUID, Groups: []uint32{}}}
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	la := &listeningAgent{home: home, bundle: b, ca: ca, cmd: cmd, stderr: &testserver.Output{}}
	exited := make(chan struct{})
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM) // outside a pid namespace: clean shutdown
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("listening agent did not exit on SIGTERM; its log:\n%s", la.stderr)
		}
	})
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(la.stderr, line)
			if _, a, ok := strings.Cut(line, "listening on "); ok {
				addrc <- a
			}
		}
		cmd.Wait()
		close(exited)
	}()
	select {
	case la.addr = <-addrc:
	case <-exited:
		t.Fatalf("agent exited: %s", la.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("agent did not report its address: %s", la.stderr)
	}
	return la
}

func (la *listeningAgent) client(t *testing.T) *agent.Client {
	t.Helper()
	cc, err := la.bundle.ClientCreds()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := agenttls.Dial(ctxT(t), la.addr, cc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := agent.NewClientConfig(conn, agent.Config{Home: la.home})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func execOut(t *testing.T, c *agent.Client, shell string) string {
	t.Helper()
	p, err := c.Exec(ctxT(t), agent.ExecRequest{Shell: shell})
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	defer p.Close()
	out, errb, _, st, err := p.Collect(ctxT(t), 1<<20)
	if err != nil || st.Code != 0 {
		t.Fatalf("exec %q: %v, status %+v, stderr %s", shell, err, st, errb)
	}
	return string(out)
}

func runCell(t *testing.T, c *agent.Client, code string) agent.Collected {
	t.Helper()
	cl, err := c.RunCode(ctxT(t), agent.CodeRequest{Code: code})
	if err != nil {
		t.Fatal(err)
	}
	out, err := cl.Collect(ctxT(t), 1<<20)
	if err != nil {
		t.Fatalf("cell %q: %v", code, err)
	}
	return out
}

// TestAgentListenTwoClients runs `airlock agent --listen` as an
// unprivileged process and drives it through two authenticated clients at
// once, as two server replicas would: both see the same files, processes
// and code context, a port served through one is reached through the
// other, a PTY works, and the second keeps working after the first closes.
func TestAgentListenTwoClients(t *testing.T) {
	la := startListeningAgent(t)
	c1, c2 := la.client(t), la.client(t)

	// The agent runs as the unprivileged uid (checked from the host), and
	// says honestly that it could not give the workload a uid of its own.
	if uid := procUID(t, la.cmd.Process.Pid); uid != fmt.Sprint(listenUID) {
		t.Fatalf("agent uid %s, want %d", uid, listenUID)
	}
	var ident string
	for _, l := range c1.AgentLayers() {
		if l.Name == "identity" {
			ident = l.State
		}
	}
	if ident != "degraded" {
		t.Fatalf("identity layer %q, want degraded (layers %+v)", ident, c1.AgentLayers())
	}
	if got := strings.TrimSpace(execOut(t, c1, "id -u")); got != fmt.Sprint(listenUID) {
		t.Fatalf("workload uid %s", got)
	}

	// A file written through one client is read through the other, and is
	// on the host's disk.
	if _, err := c1.WriteFile(ctxT(t), "shared.txt", strings.NewReader("from client one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rc, err := c2.ReadFile(ctxT(t), "shared.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(got) != "from client one\n" {
		t.Fatalf("read through client two: %q, %v", got, err)
	}
	if b, _ := os.ReadFile(filepath.Join(la.home, "shared.txt")); string(b) != "from client one\n" {
		t.Fatalf("host sees %q", b)
	}

	// One Python context, state shared by both clients.
	if out := runCell(t, c1, "x = 41\nimport os\nprint(os.getuid())"); out.Error != nil || strings.TrimSpace(out.Stdout) != fmt.Sprint(listenUID) {
		t.Fatalf("cell on client one: %+v", out)
	}
	if out := runCell(t, c2, "x + 1"); out.Error != nil || mainResult(out) != "42" {
		t.Fatalf("cell on client two: %+v", out)
	}

	// A port served by a process started through client one is reached
	// through client two (the agent dials its own loopback).
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pl.Addr().(*net.TCPAddr).Port
	pl.Close()
	srv, err := c1.Exec(ctxT(t), agent.ExecRequest{Argv: []string{"/usr/bin/python3", "-c",
		fmt.Sprintf("import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('127.0.0.1',%d))\ns.listen()\nprint('ready',flush=True)\nc,_=s.accept()\nc.sendall(b'port says '+c.recv(5))\nc.close()", port)}})
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-srv.Events(); string(ev.Data) != "ready\n" {
		t.Fatalf("port server: %+v", ev)
	}
	pc, err := c2.Dial(ctxT(t), port)
	if err != nil {
		t.Fatal(err)
	}
	pc.Write([]byte("hello"))
	if b, _ := io.ReadAll(pc); string(b) != "port says hello" {
		t.Fatalf("through the port: %q", b)
	}
	pc.Close()
	srv.Close()

	// A terminal through client two.
	tp, err := c2.Exec(ctxT(t), agent.ExecRequest{Shell: "test -t 0 && stty size", Pty: &agent.PtySize{Cols: 91, Rows: 17}})
	if err != nil {
		t.Fatal(err)
	}
	tout, _, _, tst, err := tp.Collect(ctxT(t), 1<<20)
	tp.Close()
	if err != nil || tst.Code != 0 || strings.TrimSpace(string(tout)) != "17 91" {
		t.Fatalf("pty: %q, %+v, %v", tout, tst, err)
	}

	// A background process started through client one outlives it.
	p, err := c1.Exec(ctxT(t), agent.ExecRequest{Argv: []string{"sleep", "300"}, Background: true, Tag: "bg"})
	if err != nil {
		t.Fatal(err)
	}
	bgPid := p.Pid
	p.Close()
	c1.Close()
	if out := execOut(t, c2, "echo still here"); out != "still here\n" {
		t.Fatalf("client two after client one closed: %q", out)
	}
	procs, err := c2.Processes(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, pi := range procs {
		found = found || pi.Pid == bgPid && pi.Tag == "bg"
	}
	if !found {
		t.Fatalf("background pid %d not listed through client two: %+v", bgPid, procs)
	}
	// And a new client can connect after one left.
	c3 := la.client(t)
	if out := execOut(t, c3, "cat shared.txt"); out != "from client one\n" {
		t.Fatalf("client three: %q", out)
	}
}

func mainResult(out agent.Collected) string {
	for _, r := range out.Results {
		if r.Main {
			return r.Data["text/plain"]
		}
	}
	return ""
}

func procUID(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Fields(v)[0]
		}
	}
	t.Fatal("no Uid line")
	return ""
}

// TestAgentListenHostile checks from raw clients that nothing of the agent
// protocol answers before authentication: plain TCP speaking the agent
// protocol, TLS without the token, TLS with an agent hello instead of the
// token, and Dial with a wrong token. The agent keeps serving good clients.
func TestAgentListenHostile(t *testing.T) {
	la := startListeningAgent(t)
	good := la.client(t)

	// An agent hello frame as a client sends it (longer than the preamble).
	hello := agent.AppendFrame(nil, agent.FrameHello, 0, []byte(`{"version":1,"home":"/workspace"}`))
	plain, err := net.Dial("tcp", la.addr)
	if err != nil {
		t.Fatal(err)
	}
	plain.SetDeadline(time.Now().Add(30 * time.Second))
	plain.Write(hello)
	plain.(*net.TCPConn).CloseWrite()
	got, _ := io.ReadAll(plain)
	plain.Close()
	if bytes.Contains(got, []byte("version")) || bytes.Contains(got, []byte("pid")) {
		t.Fatalf("plain TCP client got agent protocol bytes: %q", got)
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(la.bundle.CACert)
	for _, send := range [][]byte{nil, hello} {
		c, err := tls.Dial("tcp", la.addr, &tls.Config{RootCAs: pool, ServerName: "sb-listen"})
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		c.Write(send)
		c.CloseWrite()
		got, _ := io.ReadAll(c)
		c.Close()
		if string(got) != "R" {
			t.Fatalf("TLS client sending %q got %q, want only the refusal", send, got)
		}
	}

	other, _ := agenttls.NewCA(0)
	wrong, _ := other.Issue("sb-listen", 0)
	bad, err := agenttls.NewClientCreds("sb-listen", map[string][]byte{agenttls.CACertKey: la.bundle.CACert, agenttls.TokenKey: []byte(wrong.Token)})
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := agenttls.Dial(ctxT(t), la.addr, bad); !errors.Is(err, agenttls.ErrTokenRefused) {
		if conn != nil {
			conn.Close()
		}
		t.Fatalf("wrong token: %v", err)
	}
	if out := execOut(t, good, "echo fine"); out != "fine\n" {
		t.Fatalf("good client after the hostile ones: %q", out)
	}
	if log := la.stderr.String(); !strings.Contains(log, "wrong or missing token") || strings.Contains(log, la.bundle.Token) {
		t.Fatalf("agent log does not name the refusals, or shows the token:\n%s", log)
	}
}
