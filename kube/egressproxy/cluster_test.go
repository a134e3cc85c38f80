package egressproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/internal/testserver"
)

const manifest = "../../deploy/airlock/egress-proxy.yaml"

// manifestObjects decodes the proxy's manifest.
func manifestObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("%s: %v", manifest, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, &u)
		}
	}
}

// TestManifestPolicies: the NetworkPolicies in deploy/ are exactly what
// NetworkPolicies builds for that layout, and they deny what they must.
func TestManifestPolicies(t *testing.T) {
	want, err := NetworkPolicies(PolicyConfig{
		SandboxNamespace: "airlock-sandboxes",
		ServerNamespace:  "airlock", ServerLabels: map[string]string{"app.kubernetes.io/name": "airlock-server"},
		ProxyNamespace: "airlock", ProxyLabels: map[string]string{"app.kubernetes.io/name": "airlock-egress-proxy"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []*networkingv1.NetworkPolicy
	for _, u := range manifestObjects(t) {
		if u.GetKind() != "NetworkPolicy" {
			continue
		}
		var np networkingv1.NetworkPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &np); err != nil {
			t.Fatal(err)
		}
		got = append(got, &np)
	}
	if len(got) != len(want) {
		t.Fatalf("%d NetworkPolicies in %s, want %d", len(got), manifest, len(want))
	}
	for i := range want {
		if !equality.Semantic.DeepEqual(got[i], want[i]) {
			t.Errorf("%s: NetworkPolicy %s differs from NetworkPolicies():\n got %+v\nwant %+v", manifest, want[i].Name, got[i].Spec, want[i].Spec)
		}
	}
	sb := want[0].Spec
	// Egress: one rule, to the proxy pods alone, on the proxy ports: no
	// DNS (port 53), no ipBlock.
	if len(sb.Egress) != 1 || len(sb.Egress[0].To) != 1 || sb.Egress[0].To[0].IPBlock != nil || sb.Egress[0].To[0].PodSelector == nil {
		t.Fatalf("sandbox egress: %+v", sb.Egress)
	}
	for _, p := range sb.Egress[0].Ports {
		if p.Port.IntValue() == 53 {
			t.Fatal("sandbox pods may reach DNS")
		}
	}
	if len(sb.Ingress) != 1 || len(sb.Ingress[0].Ports) != 1 || sb.Ingress[0].Ports[0].Port.IntValue() != 7070 {
		t.Fatalf("sandbox ingress: %+v", sb.Ingress)
	}
	if _, err := NetworkPolicies(PolicyConfig{SandboxNamespace: "a", ServerNamespace: "b", ProxyNamespace: "c"}); err == nil {
		t.Fatal("empty selectors accepted (they would select every pod)")
	}
}

// assetsDir finds kube-apiserver and etcd as the kube package's tests do
// (scripts/kube-assets.sh).
func assetsDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	cache := os.Getenv("AIRLOCK_KUBE_CACHE")
	if cache == "" {
		cache = "/var/cache/airlock/kube"
	}
	return filepath.Join(cache, "v1.34.4", "bin")
}

// The control plane shared by the tests that need one, started on first
// use and stopped by TestMain.
var (
	envOnce sync.Once
	testEnv *envtest.Environment
	envCfg  *rest.Config
	envErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if testEnv != nil {
		testEnv.Stop()
	}
	os.Exit(code)
}

// cluster returns the admin config of a real kube-apiserver (and etcd)
// holding the namespaces and the proxy's RBAC from the manifest; it skips
// the test when scripts/kube-assets.sh has not built the binaries.
func cluster(t *testing.T) *rest.Config {
	t.Helper()
	dir := assetsDir()
	if _, err := os.Stat(filepath.Join(dir, "kube-apiserver")); err != nil {
		t.Skipf("no kube-apiserver in %s (run scripts/kube-assets.sh or set KUBEBUILDER_ASSETS): %v", dir, err)
	}
	envOnce.Do(func() {
		testEnv = &envtest.Environment{BinaryAssetsDirectory: dir, ControlPlaneStartTimeout: 3 * time.Minute}
		if envCfg, envErr = testEnv.Start(); envErr != nil {
			envErr = fmt.Errorf("start kube-apiserver and etcd from %s: %w", dir, envErr)
			return
		}
		envErr = applyProxyRBAC(envCfg, manifestObjects(t))
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	return envCfg
}

// sandboxNS is the sandboxes' namespace of deploy/airlock.
const sandboxNS = "airlock-sandboxes"

// proxyUser is the identity of the proxy's ServiceAccount.
const proxyUser = "system:serviceaccount:airlock:airlock-egress-proxy"

// applyProxyRBAC creates the namespaces and the proxy's Role and
// RoleBinding from the manifest, nothing else.
func applyProxyRBAC(cfg *rest.Config, objs []*unstructured.Unstructured) error {
	admin := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	for _, n := range []string{"airlock", sandboxNS} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for _, u := range objs {
		var err error
		switch u.GetKind() {
		case "Role":
			var r rbacv1.Role
			if err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err == nil {
				_, err = admin.RbacV1().Roles(r.Namespace).Create(ctx, &r, metav1.CreateOptions{})
			}
		case "RoleBinding":
			var rb rbacv1.RoleBinding
			if err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &rb); err == nil {
				_, err = admin.RbacV1().RoleBindings(rb.Namespace).Create(ctx, &rb, metav1.CreateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// runningPod creates a sandbox pod in the API and sets its status to
// Running at 127.0.0.1 through the status subresource.
func runningPod(ctx context.Context, t *testing.T, admin kubernetes.Interface, id, network string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{LabelSandbox: id},
			Annotations: map[string]string{AnnotationNetwork: network}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "example.invalid/none"}}},
	}
	pod, err := admin.CoreV1().Pods(sandboxNS).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}}}
	if _, err = admin.CoreV1().Pods(sandboxNS).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestWatchRealAPIServer runs the proxy fed by a real kube-apiserver (and
// etcd): pods and the egress Secret are created in the API, the pod's IP
// and phase set through the status subresource, and the proxy, bound only
// by the Role of deploy/airlock/egress-proxy.yaml, follows them.
func TestWatchRealAPIServer(t *testing.T) {
	cfg := cluster(t)
	admin := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const ns = sandboxNS
	proxyCfg := rest.CopyConfig(cfg)
	proxyCfg.Impersonate = rest.ImpersonationConfig{UserName: proxyUser}
	proxyClient := kubernetes.NewForConfigOrDie(proxyCfg)
	if _, err := proxyClient.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("the proxy's identity may list pods outside the sandboxes' namespace")
	}

	// A sandbox with a secret, its pod at 127.0.0.1 (the test's clients).
	data, err := EgressSecretData("sb-k8s", []egress.Secret{{Host: "api.example.com", Header: "Authorization", Value: testSecretValue}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: EgressSecretName("sb-k8s"), Labels: map[string]string{LabelSandbox: "sb-k8s", LabelPurpose: PurposeEgress}},
		Data:       data,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	runningPod(ctx, t, admin, "sb-k8s", allowAllowed)

	u := startUpstream(t)
	s, addr := startServer(t, u)
	if err := Watch(ctx, proxyClient, ns, s); err != nil {
		t.Fatal(err)
	}
	allowed := fmt.Sprintf("http://allowed.test:%d/hello", u.httpPort)
	if code, body := get(t, addr, allowed, nil); code != 200 {
		t.Fatalf("after the initial sync: %d %q", code, body)
	}
	trust := x509.NewCertPool()
	trust.AppendCertsFromPEM(data[CACertKey])
	if code, body := get(t, addr, fmt.Sprintf("https://api.example.com:%d/auth", u.httpsPort), trust); code != 200 {
		t.Fatalf("injection: %d %q", code, body)
	}

	// A policy change made in the API reaches the proxy.
	patch := []byte(`{"metadata":{"annotations":{"airlock.dev/network":"{\"mode\":\"allowlist\",\"allow\":[\"other.test\",\"127.0.0.1\"]}"}}}`)
	if _, err := admin.CoreV1().Pods(ns).Patch(ctx, "sb-k8s", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the policy change", func() bool { code, _ := get(t, addr, allowed, nil); return code == 403 })

	// The pod is deleted: its IP no longer identifies the sandbox.
	if err := admin.CoreV1().Pods(ns).Delete(ctx, "sb-k8s", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod's deletion", func() bool {
		_, body := get(t, addr, fmt.Sprintf("http://other.test:%d/hello", u.httpPort), nil)
		return strings.Contains(body, "unknown source 127.0.0.1")
	})
}

// waitFor polls cond for up to three minutes (the watch is asynchronous,
// and slow on a loaded machine).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not see %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEgressProxyCommand runs `airlock egress-proxy` as a process against
// the real kube-apiserver, as the proxy's ServiceAccount (a kubeconfig that
// impersonates it), and proxies through it for a pod created in the API.
func TestEgressProxyCommand(t *testing.T) {
	cluster(t)
	admin := kubernetes.NewForConfigOrDie(envCfg)
	// Built first: on a loaded machine the build alone can take minutes,
	// which must not come out of the API calls' time.
	bin := testserver.KubernetesBinary(t)

	kc, err := clientcmd.Load(testEnv.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = proxyUser
	}
	kcFile := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kcFile); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "egress-proxy", "--kubeconfig", kcFile, "--namespace", sandboxNS,
		"--http", "127.0.0.1:0", "--socks", "127.0.0.1:0", "-v")
	var logs testserver.Output
	pipe, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	addrc := make(chan string, 2)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			fmt.Fprintln(&logs, sc.Text())
			var rec struct{ Msg, Kind, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" && rec.Kind == "http" {
				addrc <- rec.Addr
			}
		}
		exited <- cmd.Wait()
	}()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("egress-proxy exit: %v\n%s", err, logs.String())
			}
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
			t.Errorf("egress-proxy did not exit on SIGTERM")
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-exited:
		t.Fatalf("egress-proxy exited: %v\n%s", err, logs.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("egress-proxy did not listen:\n%s", logs.String())
	}

	u := startUpstream(t)
	target := fmt.Sprintf("http://127.0.0.1:%d/cmd", u.httpPort)
	if code, body := get(t, addr, target, nil); code != 403 || !strings.Contains(body, "unknown source") {
		t.Fatalf("before the pod: %d %q", code, body)
	}
	// The API calls' own bound, counted from here (a client's rate
	// limiter refuses to wait past its context's deadline).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	runningPod(ctx, t, admin, "sb-cmd", `{"mode":"allowlist","allow":["127.0.0.1"]}`)
	defer func() {
		// Removed even when the test ran out of its time.
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		admin.CoreV1().Pods(sandboxNS).Delete(dctx, "sb-cmd", metav1.DeleteOptions{})
	}()
	waitFor(t, "the pod", func() bool { code, _ := get(t, addr, target, nil); return code == 200 })
	waitFor(t, "the connection in its log", func() bool {
		return strings.Contains(logs.String(), `"msg":"connection","sandbox":"sb-cmd","host":"127.0.0.1"`)
	})
}
