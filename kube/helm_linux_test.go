package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"text/template"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// chartDir is the Helm chart of airlock.
var chartDir = filepath.Join("..", "deploy", "helm", "airlock")

// helmFuncs are the template functions the chart may use: Helm's own
// (include, toYaml, required) and the Sprig functions it uses (default,
// quote, nindent, indent), with Helm's meaning. A template calling any
// other fails to parse, so the chart stays within what this test renders
// (the helm binary is not installed on the test machines, and its Go
// library would move k8s.io/* to v0.37).
func helmFuncs(tpl **template.Template) template.FuncMap {
	return template.FuncMap{
		"include": func(name string, data any) (string, error) {
			var b bytes.Buffer
			err := (*tpl).ExecuteTemplate(&b, name, data)
			return b.String(), err
		},
		"toYaml": func(v any) (string, error) {
			b, err := yaml.Marshal(v)
			return strings.TrimSuffix(string(b), "\n"), err
		},
		"required": func(msg string, v any) (any, error) {
			if v == nil || v == "" {
				return nil, errors.New(msg)
			}
			return v, nil
		},
		"default": func(d any, v ...any) any {
			if len(v) == 0 || v[0] == nil || v[0] == "" || v[0] == false {
				return d
			}
			return v[0]
		},
		"quote": func(v ...any) string {
			out := make([]string, len(v))
			for i, s := range v {
				out[i] = fmt.Sprintf("%q", fmt.Sprint(s))
			}
			return strings.Join(out, " ")
		},
		"indent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
		"nindent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
	}
}

// renderChart renders the chart as `helm template RELEASE -n NAMESPACE
// --set ...` would, with set merged over values.yaml, and returns its
// objects.
func renderChart(t *testing.T, release, namespace string, set map[string]any) []*unstructured.Unstructured {
	t.Helper()
	var values map[string]any
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	for k, v := range set {
		mergeValue(values, strings.Split(k, "."), v)
	}
	var chart map[string]any
	if b, err = os.ReadFile(filepath.Join(chartDir, "Chart.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	if chart["apiVersion"] != "v2" || chart["name"] != "airlock" || chart["version"] == nil {
		t.Fatalf("Chart.yaml: %v", chart)
	}
	data := map[string]any{
		"Values":  values,
		"Release": map[string]any{"Name": release, "Namespace": namespace, "Service": "Helm"},
		"Chart":   map[string]any{"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
	}
	files, err := filepath.Glob(filepath.Join(chartDir, "templates", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no templates: %v", err)
	}
	sort.Strings(files)
	var tpl *template.Template
	tpl = template.New("chart").Option("missingkey=error").Funcs(helmFuncs(&tpl))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tpl.New(filepath.Base(f)).Parse(string(b)); err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		base := filepath.Base(f)
		if strings.HasPrefix(base, "_") {
			continue
		}
		var doc bytes.Buffer
		if err := tpl.ExecuteTemplate(&doc, base, data); err != nil {
			t.Fatalf("render %s: %v", base, err)
		}
		tmp := filepath.Join(t.TempDir(), base)
		if err := os.WriteFile(tmp, doc.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		objs, err := decodeFile(tmp)
		if err != nil {
			t.Fatalf("%s renders invalid YAML: %v\n%s", base, err, doc.Bytes())
		}
		out = append(out, objs...)
	}
	return out
}

// mergeValue sets path in values (as --set does).
func mergeValue(values map[string]any, path []string, v any) {
	for len(path) > 1 {
		next, ok := values[path[0]].(map[string]any)
		if !ok {
			next = map[string]any{}
			values[path[0]] = next
		}
		values, path = next, path[1:]
	}
	values[path[0]] = v
}

func objKey(u *unstructured.Unstructured) string {
	return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
}

// TestHelmChartMatchesManifests: rendered with its defaults as release
// "airlock" in namespace "airlock", the chart deploy/helm/airlock makes
// exactly the objects of deploy/airlock (the release namespace itself
// aside, which `helm install --create-namespace` makes): the same RBAC, the
// same NetworkPolicies (which kube/egressproxy checks against
// NetworkPolicies()), the same server and proxy. The database Secret is made
// only when database.url is given, and no database at all is refused.
func TestHelmChartMatchesManifests(t *testing.T) {
	got := map[string]*unstructured.Unstructured{}
	for _, u := range renderChart(t, "airlock", "airlock", nil) {
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
	objs := renderChart(t, "rel", "ns", map[string]any{"database.url": "postgres://a:b@db/airlock", "database.existingSecret": ""})
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
	if url, _, _ := unstructured.NestedString(secret.Object, "stringData", "url"); url != "postgres://a:b@db/airlock" {
		t.Errorf("database Secret url %q", url)
	}
	cs, _, _ := unstructured.NestedSlice(server.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 || !strings.Contains(fmt.Sprint(cs[0]), "name:rel-database") {
		t.Errorf("the server does not read the chart's database Secret: %v", cs)
	}
	// Neither url nor existingSecret: refused at render time.
	var tpl *template.Template
	tpl = template.New("x").Option("missingkey=error").Funcs(helmFuncs(&tpl))
	b, err := os.ReadFile(filepath.Join(chartDir, "templates", "server.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	template.Must(tpl.Parse(string(b)))
	var values map[string]any
	vb, _ := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err := yaml.Unmarshal(vb, &values); err != nil {
		t.Fatal(err)
	}
	values["database"] = map[string]any{"url": "", "existingSecret": ""}
	err = tpl.Execute(&bytes.Buffer{}, map[string]any{"Values": values, "Release": map[string]any{"Name": "r", "Namespace": "n"}})
	if err == nil || !strings.Contains(err.Error(), "database.url or database.existingSecret") {
		t.Errorf("no database: %v, want a refusal naming database.url", err)
	}
}

// TestHelmChartInstalls: the chart rendered for another release, another
// namespace and two RuntimeClasses is created for real in the test
// kube-apiserver (as `helm install --create-namespace` would): every
// object passes the API server's validation, the server's arguments name
// the release's own egress Service and both tiers, and the sandboxes'
// namespace enforces Pod Security restricted.
func TestHelmChartInstalls(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	objs := renderChart(t, "helmt", "helmt-system", map[string]any{
		"sandboxNamespace": "helmt-sandboxes",
		"database.url":     "postgres://airlock@db/airlock",
		"server.pool":      3,
		"runtimeClasses": []any{
			map[string]any{"tier": "gvisor", "name": "helmt-gvisor", "handler": "runsc", "create": true},
			map[string]any{"tier": "microvm", "name": "helmt-kata", "handler": "kata", "create": true},
		},
	})
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "helmt-system"}}}
	if err := admin.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// Namespaces first, as helm orders them.
	sort.SliceStable(objs, func(i, j int) bool { return objs[i].GetKind() == "Namespace" && objs[j].GetKind() != "Namespace" })
	kinds := map[string]int{}
	for _, u := range objs {
		kinds[u.GetKind()]++
		if err := admin.Create(ctx, u); err != nil {
			t.Errorf("create %s: %v", objKey(u), err)
			continue
		}
		t.Cleanup(func() { admin.Delete(context.Background(), u) })
	}
	t.Cleanup(func() { admin.Delete(context.Background(), ns) })
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
		"--namespace=helmt-sandboxes", "--agent-image=registry.example.com/airlock:latest", "--pool=3"} {
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
}
