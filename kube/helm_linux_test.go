package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// chartDir is the Helm chart of airlock.
var chartDir = filepath.Join("..", "deploy", "helm", "airlock")

// helmBin returns the helm CLI of scripts/helm.sh (helm.sh/helm/v4 at
// HelmVersion, cached under $AIRLOCK_KUBE_CACHE/helm). scripts/setup.sh
// --tests builds it in the background, holding the cache's build lock:
// while that lock is held and helm is not there yet, helmBin waits (until
// a few minutes before the test's deadline). When helm is still missing it
// fails as root (CI, where setup ran) and skips otherwise, as the package's
// control-plane tests do (TestMain).
func helmBin(t *testing.T) string {
	t.Helper()
	want := scriptVar(t, filepath.Join("..", "scripts", "helm.sh"), "HELM_VERSION")
	if want != HelmVersion {
		t.Fatalf("scripts/helm.sh builds helm %s, kube.HelmVersion is %s: keep them in step", want, HelmVersion)
	}
	path := HelmPath()
	lock := filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(path))), "build.lock")
	until := time.Now().Add(30 * time.Minute)
	if d, ok := t.Deadline(); ok {
		until = d.Add(-5 * time.Minute)
	}
	t0 := time.Now()
	for !executable(path) {
		if !lockHeld(lock) && !executable(path) || time.Now().After(until) {
			msg := fmt.Sprintf("no helm %s at %s: run scripts/setup.sh --tests (it builds it in the background; log %s) or scripts/helm.sh",
				HelmVersion, path, filepath.Join(filepath.Dir(lock), "e2e-build.log"))
			if os.Geteuid() != 0 {
				t.Skip(msg + " (not root)")
			}
			t.Fatal(msg)
		}
		time.Sleep(3 * time.Second)
	}
	if d := time.Since(t0); d > time.Second {
		t.Logf("waited %v for scripts/helm.sh's build (under %s)", d.Round(time.Second), lock)
	}
	if v, err := exec.Command(path, "version", "--template", "{{.Version}}").Output(); err != nil || string(v) != HelmVersion {
		t.Fatalf("%s version: %q (%v), want %s", path, v, err, HelmVersion)
	}
	return path
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// lockHeld reports whether another process holds the flock on path (a
// shared lock is tried and released at once).
func lockHeld(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// scriptVar returns the default of a shell script's `NAME=${NAME:-value}`.
func scriptVar(t *testing.T, file, name string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + `=\$\{` + name + `:-([^}]+)\}$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s: no %s=${%s:-...}", file, name, name)
	}
	return string(m[1])
}

// helm runs the helm CLI with its own empty configuration, cache and data
// directories (no repositories, no plugins: only the chart on disk) and
// returns its standard output; on failure the error holds its standard
// error.
func helm(t *testing.T, bin string, args ...string) ([]byte, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_DATA_HOME="+filepath.Join(home, "data"), "KUBECONFIG=/nonexistent")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

// valuesFile writes values (YAML) for -f and returns its path.
func valuesFile(t *testing.T, values map[string]any) string {
	t.Helper()
	b, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// renderChart renders the chart with the real helm, as `helm template
// RELEASE CHART -n NAMESPACE -f values`, and returns its objects.
func renderChart(t *testing.T, bin, release, namespace string, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", namespace}
	if values != nil {
		args = append(args, "-f", valuesFile(t, values))
	}
	out, err := helm(t, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeHelmOutput(t, out)
}

// decodeHelmOutput returns the objects of helm's multi-document YAML
// output (`helm template`, `helm get manifest`).
func decodeHelmOutput(t *testing.T, out []byte) []*unstructured.Unstructured {
	t.Helper()
	tmp := filepath.Join(t.TempDir(), "helm-output.yaml")
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		t.Fatal(err)
	}
	objs, err := decodeFile(tmp)
	if err != nil {
		t.Fatalf("helm's output is not valid YAML: %v\n%s", err, out)
	}
	return objs
}

func objKey(u *unstructured.Unstructured) string {
	return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
}

// TestHelmChartLints: `helm lint --strict` (warnings are errors) finds
// nothing in deploy/helm/airlock, with its defaults and with the values
// of a release that makes its own database Secret and two RuntimeClasses.
func TestHelmChartLints(t *testing.T) {
	t.Parallel()
	bin := helmBin(t)
	for _, values := range []map[string]any{nil, {
		"database": map[string]any{"url": "postgres://a:b@db/airlock", "existingSecret": ""},
		"runtimeClasses": []any{
			map[string]any{"tier": "gvisor", "name": "gvisor", "handler": "runsc", "create": true},
			map[string]any{"tier": "microvm", "name": "kata", "handler": "kata", "create": false},
		},
	}} {
		args := []string{"lint", "--strict", chartDir}
		if values != nil {
			args = append(args, "-f", valuesFile(t, values))
		}
		out, err := helm(t, bin, args...)
		if err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	}
}

// TestHelmChartMatchesManifests: rendered by helm with its defaults as
// release "airlock" in namespace "airlock", the chart deploy/helm/airlock
// makes exactly the objects of deploy/airlock (the release namespace
// itself aside, which `helm install --create-namespace` makes): the same
// RBAC, the same NetworkPolicies (which kube/egressproxy checks against
// NetworkPolicies()), the same server and proxy. The database Secret is
// made only when database.url is given, holding it byte for byte, and no
// database at all is refused.
func TestHelmChartMatchesManifests(t *testing.T) {
	t.Parallel()
	bin := helmBin(t)
	got := map[string]*unstructured.Unstructured{}
	for _, u := range renderChart(t, bin, "airlock", "airlock", nil) {
		if _, dup := got[objKey(u)]; dup {
			t.Errorf("the chart renders %s twice", objKey(u))
		}
		got[objKey(u)] = u
	}
	want := map[string]*unstructured.Unstructured{}
	files, _ := filepath.Glob(filepath.Join("..", "deploy", "airlock", "*.yaml"))
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		objs, err := decodeFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range objs {
			if u.GetKind() == "Namespace" && u.GetName() == "airlock" {
				continue
			}
			want[objKey(u)] = u
		}
	}
	if len(want) < 10 {
		t.Fatalf("only %d objects in deploy/airlock", len(want))
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("the chart does not render %s of deploy/airlock", k)
			continue
		}
		if !reflect.DeepEqual(g.Object, w.Object) {
			gb, _ := yaml.Marshal(g.Object)
			wb, _ := yaml.Marshal(w.Object)
			t.Errorf("%s differs from deploy/airlock's:\nchart:\n%s\ndeploy/airlock:\n%s", k, gb, wb)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("the chart renders %s, which deploy/airlock lacks", k)
		}
	}

	// database.url: the chart makes the Secret, and the server reads it.
	// The URL is a password's carrier: quotes, a newline, YAML and
	// template syntax in it stay data.
	url := "postgres://a:p\"w'{{ .Release.Name }}\n- x: y #@db/airlock"
	objs := renderChart(t, bin, "rel", "ns", map[string]any{"database": map[string]any{"url": url, "existingSecret": ""}})
	var secret, server *unstructured.Unstructured
	for _, u := range objs {
		switch objKey(u) {
		case "Secret ns/rel-database":
			secret = u
		case "Deployment ns/rel-server":
			server = u
		}
	}
	if secret == nil || server == nil {
		t.Fatalf("with database.url: Secret %v, server %v", secret != nil, server != nil)
	}
	if got, _, _ := unstructured.NestedString(secret.Object, "stringData", "url"); got != url {
		t.Errorf("database Secret url %q, want %q", got, url)
	}
	cs, _, _ := unstructured.NestedSlice(server.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 || !strings.Contains(fmt.Sprint(cs[0]), "name:rel-database") {
		t.Errorf("the server does not read the chart's database Secret: %v", cs)
	}
	// Neither url nor existingSecret: refused at render time.
	out, err := helm(t, bin, "template", "r", chartDir, "-n", "n", "-f", valuesFile(t, map[string]any{"database": map[string]any{"url": "", "existingSecret": ""}}))
	if err == nil || !strings.Contains(err.Error(), "database.url or database.existingSecret") {
		t.Errorf("no database: %v, want a refusal naming database.url\n%s", err, out)
	}
}

// TestHelmChartInstalls: `helm install` of the chart for another release,
// another namespace and two RuntimeClasses into the test kube-apiserver
// (server-side apply, as helm v4 installs): every object passes the API
// server's validation, the server's arguments name the release's own
// egress Service and both tiers, the sandboxes' namespace enforces Pod
// Security restricted, and `helm uninstall` leaves none of the release's
// cluster-wide objects behind (RuntimeClasses, ClusterRole, binding).
func TestHelmChartInstalls(t *testing.T) {
	t.Parallel()
	needEnv(t)
	bin := helmBin(t)
	ctx := context.Background()
	u, err := testEnv.AddUser(envtest.User{Name: "helm-test", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	values := valuesFile(t, map[string]any{
		"sandboxNamespace": "helmt-sandboxes",
		"database":         map[string]any{"url": "postgres://airlock@db/airlock", "existingSecret": ""},
		"server":           map[string]any{"pool": 3, "poolReserve": 2},
		"runtimeClasses": []any{
			map[string]any{"tier": "gvisor", "name": "helmt-gvisor", "handler": "runsc", "create": true},
			map[string]any{"tier": "microvm", "name": "helmt-kata", "handler": "kata", "create": true},
		},
	})
	out, err := helm(t, bin, "install", "helmt", chartDir, "--kubeconfig", kubeconfig, "-n", "helmt-system", "--create-namespace", "-f", values)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	manifest, err := helm(t, bin, "get", "manifest", "helmt", "--kubeconfig", kubeconfig, "-n", "helmt-system")
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeHelmOutput(t, manifest)
	kinds := map[string]int{}
	var clusterWide []string
	for _, o := range objs {
		kinds[o.GetKind()]++
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(o.GroupVersionKind())
		if err := admin.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetName()}, live); err != nil {
			t.Errorf("%s of the release is not in the API server: %v", objKey(o), err)
		}
		if o.GetNamespace() == "" && o.GetKind() != "Namespace" {
			clusterWide = append(clusterWide, objKey(o))
		}
	}
	for kind, n := range map[string]int{"Deployment": 2, "Service": 2, "NetworkPolicy": 2, "RuntimeClass": 2, "Secret": 1,
		"Role": 2, "RoleBinding": 2, "ClusterRole": 1, "ClusterRoleBinding": 1, "ServiceAccount": 2, "Namespace": 1} {
		if kinds[kind] != n {
			t.Errorf("%d %s objects, want %d (all: %v)", kinds[kind], kind, n, kinds)
		}
	}
	var dep unstructured.Unstructured
	dep.SetAPIVersion("apps/v1")
	dep.SetKind("Deployment")
	if err := admin.Get(ctx, client.ObjectKey{Namespace: "helmt-system", Name: "helmt-server"}, &dep); err != nil {
		t.Fatal(err)
	}
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	args := fmt.Sprint(cs)
	for _, want := range []string{"--runtime-class=gvisor=helmt-gvisor,microvm=helmt-kata", "--kube-egress-proxy=helmt-egress.helmt-system.svc:3128",
		"--namespace=helmt-sandboxes", "--agent-image=registry.example.com/airlock:latest", "--pool=3", "--pool-reserve=2"} {
		if !strings.Contains(args, want) {
			t.Errorf("server arguments lack %s: %s", want, args)
		}
	}
	var sbns unstructured.Unstructured
	sbns.SetAPIVersion("v1")
	sbns.SetKind("Namespace")
	if err := admin.Get(ctx, client.ObjectKey{Name: "helmt-sandboxes"}, &sbns); err != nil || sbns.GetLabels()["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("sandboxes namespace labels %v (%v)", sbns.GetLabels(), err)
	}

	// Uninstall: helm deletes every object of the release (the sandboxes'
	// Namespace stays Terminating: envtest runs no namespace controller).
	if out, err := helm(t, bin, "uninstall", "helmt", "--kubeconfig", kubeconfig, "-n", "helmt-system"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(clusterWide) != 4 {
		t.Errorf("cluster-wide objects of the release: %d, want 4 (2 RuntimeClasses, ClusterRole, ClusterRoleBinding)", len(clusterWide))
	}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			continue
		}
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(o.GroupVersionKind())
		if err := admin.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetName()}, live); !apierrors.IsNotFound(err) {
			t.Errorf("%s after helm uninstall: %v, want NotFound", objKey(o), err)
		}
	}
}
