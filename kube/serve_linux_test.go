package kube

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	alclient "github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// writeKubeconfig writes a kubeconfig file for cfg (client certificate).
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	b64 := base64.StdEncoding.EncodeToString
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: airlock-server
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: test
  context: {cluster: test, user: airlock-server}
current-context: test
`, cfg.Host, b64(cfg.CAData), b64(cfg.CertData), b64(cfg.KeyData))
	f := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(f, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// serveReplica is a running `airlock serve --backend kubernetes`.
type serveReplica struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
	log  strings.Builder
	mu   sync.Mutex
}

// startServe starts `airlock serve --backend kubernetes` with kubeconfig;
// extra flags come last (and so override the defaults here).
func startServe(t *testing.T, kubeconfig string, extra ...string) *serveReplica {
	t.Helper()
	args := []string{"serve", "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--no-auth",
		"--backend", "kubernetes", "--kubeconfig", kubeconfig, "--namespace", sandboxNS,
		"--agent-image", "registry.test/airlock:1", "--default-image", "registry.test/python:3", "--kube-ready-timeout", "90s"}
	cmd := exec.Command(testserver.KubernetesBinary(t), append(args, extra...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sr := &serveReplica{cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &sr.mu, b: &sr.log}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if _, u, ok := strings.Cut(sc.Text(), "listening on "); ok {
				urlc <- u
			}
		}
		cmd.Wait()
		close(sr.done)
	}()
	t.Cleanup(func() {
		sr.kill()
		if t.Failed() {
			t.Logf("serve log:\n%s", sr.logs())
		}
	})
	select {
	case sr.url = <-urlc:
	case <-sr.done:
		t.Fatalf("serve exited: %s", sr.logs())
	case <-time.After(2 * time.Minute):
		t.Fatalf("serve did not start: %s", sr.logs())
	}
	return sr
}

func (sr *serveReplica) logs() string {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	return sr.log.String()
}

// kill kills the server as a node failure would (SIGKILL).
func (sr *serveReplica) kill() {
	sr.cmd.Process.Signal(syscall.SIGKILL)
	<-sr.done
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestServeBackendKubernetes: two `airlock serve --backend kubernetes`
// processes (built with -tags kubernetes, as the ServiceAccount of
// deploy/airlock/rbac.yaml through a kubeconfig) behind the same API: a
// create through one waits for the sandbox's pod and agent and answers
// 201; exec and files work through the other; the first is killed with
// SIGKILL and the second still serves the sandbox, then kills it (the
// Sandbox is gone from the API).
func TestServeBackendKubernetes(t *testing.T) {
	needEnv(t)
	testserver.NeedRoot(t)
	kc := writeKubeconfig(t, serverCfg)
	a, b := startServe(t, kc), startServe(t, kc)
	ca, cb := alclient.New(a.url, ""), alclient.New(b.url, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	nonce := fmt.Sprintf("n%d", rand.Uint64())
	type created struct {
		sb  *alclient.Sandbox
		err error
	}
	res := make(chan created, 1)
	go func() {
		sb, err := ca.Create(ctx, alclient.CreateRequest{Metadata: map[string]string{"nonce": nonce}})
		res <- created{sb, err}
	}()
	// Play agent-sandbox's controller and the kubelet: once the Sandbox
	// exists, run its pod's agent at a loopback address of its own on the
	// agent port the server dials.
	var id string
	for id == "" {
		var l sandboxv1.SandboxList
		if err := admin.List(ctx, &l, client.InNamespace(sandboxNS)); err != nil {
			t.Fatal(err)
		}
		for _, sb := range l.Items {
			if strings.Contains(sb.Annotations[AnnotationMetadata], nonce) {
				id = sb.Name
			}
		}
		select {
		case r := <-res:
			t.Fatalf("create answered before the pod ran: %+v %v", r.sb, r.err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	ip := fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(250), 1+rand.IntN(250), 1+rand.IntN(250))
	pa := startPodAgent(t, id, ip, AgentPort)
	r := <-res
	if r.err != nil || r.sb.ID != id {
		t.Fatalf("create: %+v %v", r.sb, r.err)
	}

	run := func(c *alclient.Client, shell string) string {
		t.Helper()
		res, err := c.Exec(ctx, id, alclient.ExecRequest{Shell: shell, Cwd: pa.work})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q: %+v %v", shell, res, err)
		}
		return res.Stdout
	}
	if got := run(cb, "echo from-b > f; id -u"); got != "1000\n" {
		t.Errorf("exec through replica b: %q", got)
	}
	if data, err := ca.ReadFile(ctx, id, filepath.Join(pa.work, "f")); err != nil || string(data) != "from-b\n" {
		t.Errorf("read through replica a: %q %v", data, err)
	}
	if _, err := cb.Metrics(ctx, id); err != nil {
		t.Errorf("metrics through replica b: %v", err)
	}
	if sb, err := cb.SetTimeout(ctx, id, 30*time.Minute); err != nil || sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) < 29*time.Minute {
		t.Errorf("timeout through replica b: %+v %v", sb, err)
	}
	a.kill()
	if got := run(cb, "cat f"); got != "from-b\n" {
		t.Errorf("after replica a died: %q", got)
	}
	l, err := cb.List(ctx, map[string]string{"nonce": nonce})
	if err != nil || len(l) != 1 || l[0].ID != id {
		t.Errorf("list through b: %+v %v", l, err)
	}
	if err := cb.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: sandboxNS, Name: id}, &sandboxv1.Sandbox{}); !apierrors.IsNotFound(err) {
		t.Errorf("Sandbox after kill through the API: %v", err)
	}
}
