package kube

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/kube/agenttls"
	"github.com/airlock-dev/airlock/manager"
)

// podAgent is a sandbox's agent run as its pod would run it (airlock agent
// --listen with the sandbox's Secret as its TLS directory, as the pod's
// uid), on 127.0.0.1, standing in for the pod the kubelet would start.
type podAgent struct {
	port int
	work string // its working directory
	cmd  *exec.Cmd
	done chan struct{}
}

// startPodAgent runs sandbox id's agent with the data of its Secret (read
// from the API) on ip (a loopback address) and port (0: any), and
// publishes a Pod object for it, Running at ip, made from the Sandbox's pod
// template, as agent-sandbox's controller and the kubelet would.
func startPodAgent(t *testing.T, id, ip string, port int) *podAgent {
	t.Helper()
	ctx := context.Background()
	var sec corev1.Secret
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: agenttls.SecretName(id)}, &sec); err != nil {
		t.Fatal(err)
	}
	root, err := os.MkdirTemp("", "airlock-pod-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	os.Chmod(root, 0o755)
	tlsDir := filepath.Join(root, "airlock-tls")
	work := filepath.Join(root, "workspace")
	for _, d := range []string{tlsDir, work} {
		os.Mkdir(d, 0o755)
		os.Chown(d, sandboxUID, sandboxUID)
	}
	for k, v := range sec.Data {
		f := filepath.Join(tlsDir, k)
		if err := os.WriteFile(f, v, 0o400); err != nil {
			t.Fatal(err)
		}
		os.Chown(f, sandboxUID, sandboxUID)
	}
	pa := runPodAgent(t, work, "--listen", net.JoinHostPort(ip, strconv.Itoa(port)), "--tls-dir", tlsDir)

	sb := getSandbox(t, id)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: sandboxNS, Labels: sb.Spec.PodTemplate.ObjectMeta.Labels},
		Spec: *sb.Spec.PodTemplate.Spec.DeepCopy()}
	if err := admin.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if err := admin.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return pa
}

// runPodAgent runs `airlock agent args...` as the pod's uid in work and
// returns once it listens.
func runPodAgent(t *testing.T, work string, args ...string) *podAgent {
	t.Helper()
	// The tagged build, which TestServeBackendKubernetes needs anyway: one
	// airlock build for the package.
	cmd := exec.Command(testserver.KubernetesBinary(t), append([]string{"agent"}, args...)...)
	cmd.Dir = work
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + work, "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: sandboxUID, Gid: sandboxUID, Groups: []uint32{}}}
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pa := &podAgent{cmd: cmd, work: work, done: make(chan struct{})}
	addr := make(chan string, 1)
	var log strings.Builder
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if _, a, ok := strings.Cut(sc.Text(), "listening on "); ok {
				addr <- a
			}
		}
		cmd.Wait()
		close(pa.done)
	}()
	t.Cleanup(func() { pa.stop() })
	select {
	case a := <-addr:
		_, p, _ := net.SplitHostPort(a)
		pa.port, _ = strconv.Atoi(p)
	case <-pa.done:
		t.Fatalf("agent exited: %s", log.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("agent did not start: %s", log.String())
	}
	return pa
}

func (pa *podAgent) stop() {
	pa.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-pa.done:
	case <-time.After(10 * time.Second):
		pa.cmd.Process.Kill()
		<-pa.done
	}
}

// execOut runs shell through c and returns its stdout.
func execOut(t *testing.T, c *agent.Client, cwd, shell string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// In a pod the agent's home is /workspace; this stand-in's is cwd.
	p, err := c.Exec(ctx, agent.ExecRequest{Shell: shell, Cwd: cwd})
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	defer p.Close()
	out, errb, _, st, err := p.Collect(ctx, 1<<20)
	if err != nil || st.Code != 0 {
		t.Fatalf("exec %q: %v, status %+v, stderr %s", shell, err, st, errb)
	}
	return string(out)
}

// TestConnectAgentTwoReplicas: each of two replicas that did not create a
// sandbox finds its pod through the API, dials its agent with the
// sandbox's Secret (TLS + token) and runs commands; the state the agent
// holds is the same through both; when one replica dies the other keeps
// working; a killed sandbox's agent is no longer reachable through the API.
func TestConnectAgentTwoReplicas(t *testing.T) {
	needEnv(t)
	testserver.NeedRoot(t)
	a := newReplica(t, nil)
	ctx := context.Background()
	in, err := a.m.Create(ctx, manager.CreateRequest{Owner: "key-conn"})
	if err != nil {
		t.Fatal(err)
	}
	pa := startPodAgent(t, in.ID, "127.0.0.1", 0)
	r1, r2 := newReplica(t, nil), newReplica(t, nil)
	r1.b.port, r2.b.port = pa.port, pa.port

	sb1, err := r1.m.Lookup("key-conn", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	execOut(t, sb1.Agent(), pa.work, "echo hi > note")
	sb2, err := r2.m.Lookup("key-conn", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := execOut(t, sb2.Agent(), pa.work, "cat note; id -u"); got != "hi\n"+strconv.Itoa(sandboxUID)+"\n" {
		t.Errorf("second replica reads %q", got)
	}
	if _, err := r2.m.Lookup("key-other", in.ID); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("another owner's lookup: %v", err)
	}
	// The same replica reuses its connection.
	again, err := r2.m.Lookup("key-conn", in.ID)
	if err != nil || again.Agent() != sb2.Agent() {
		t.Errorf("second lookup: %v, same client %v", err, err == nil && again.Agent() == sb2.Agent())
	}
	// Replica 1 dies: replica 2 and the agent go on.
	r1.close()
	if got := execOut(t, sb2.Agent(), pa.work, "echo still; cat note"); got != "still\nhi\n" {
		t.Errorf("after replica 1 died: %q", got)
	}
	// Kill through replica 2: the Sandbox is gone, so lookups fail even
	// though this stand-in agent (no kubelet to stop it) still runs.
	if err := r2.m.Kill(ctx, "key-conn", in.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.m.Lookup("key-conn", in.ID); !errors.Is(err, manager.ErrNotFound) {
		t.Errorf("lookup after kill: %v", err)
	}
	select {
	case <-sb2.Agent().Done():
	case <-time.After(10 * time.Second):
		t.Error("the killing replica kept its connection to the killed sandbox")
	}
}

// TestConnectAfterPodReplaced: when a sandbox's pod is replaced (a resume
// after a pause, which is operatingMode Suspended then Running, or a pod recreated), a replica
// holding a connection to the old pod dials the new one: the connection is
// kept per pod UID. The new pod starts empty, as docs/kubernetes.md says of
// pause.
func TestConnectAfterPodReplaced(t *testing.T) {
	needEnv(t)
	testserver.NeedRoot(t)
	r := newReplica(t, nil)
	ctx := context.Background()
	in, err := r.m.Create(ctx, manager.CreateRequest{Owner: "key-repl"})
	if err != nil {
		t.Fatal(err)
	}
	pa := startPodAgent(t, in.ID, "127.0.0.1", 0)
	r.b.port = pa.port
	sb, err := r.m.Lookup("key-repl", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	execOut(t, sb.Agent(), pa.work, "echo one > f")
	old := sb.Agent()

	if _, err := r.m.Pause(ctx, "key-repl", in.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-old.Done():
	case <-time.After(10 * time.Second):
		t.Error("pausing kept the connection to the old pod")
	}
	// agent-sandbox's controller deletes the pod when Suspended ...
	pa.stop()
	if err := admin.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: in.ID}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.m.Resume(ctx, "key-repl", in.ID); err != nil {
		t.Fatal(err)
	}
	// ... and makes a new one when Running.
	pb := startPodAgent(t, in.ID, "127.0.0.1", 0)
	r.b.port = pb.port
	sb2, err := r.m.Lookup("key-repl", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sb2.Agent() == old {
		t.Fatal("the replica reused its connection to the old pod")
	}
	if got := execOut(t, sb2.Agent(), pb.work, "test -e f && echo kept || echo fresh"); got != "fresh\n" {
		t.Errorf("the new pod's workspace: %q", got)
	}
	// Replaced again without a pause (a pod recreated): the cached
	// connection is to another pod UID, so it is dialed anew.
	pb.stop()
	if err := admin.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sandboxNS, Name: in.ID}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	pc := startPodAgent(t, in.ID, "127.0.0.1", 0)
	r.b.port = pc.port
	sb3, err := r.m.Lookup("key-repl", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := execOut(t, sb3.Agent(), pc.work, "echo third"); got != "third\n" {
		t.Errorf("third pod: %q", got)
	}
}
