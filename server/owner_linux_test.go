package server_test

import (
	"archive/tar"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/client"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/pgtest"
	"github.com/airlock-dev/airlock/volume"
)

// tenantCall sends one request with header auth (Authorization: Bearer
// or E2B's X-API-Key) and returns the status and body.
func tenantCall(t *testing.T, method, u, header, secret, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if header == "X-API-Key" {
		req.Header.Set(header, secret)
	} else {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// mcpBearer adds a bearer key to every MCP request.
type mcpBearer struct{ key string }

func (b mcpBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// templateBody is a POST /v1/templates body: FROM from, a COPY of one
// file holding content.
func templateBody(name, from, content string) string {
	b, _ := json.Marshal(map[string]any{"name": name, "dockerfile": "FROM " + from + "\nCOPY note /opt/note\n",
		"files": map[string]string{"note": base64.StdEncoding.EncodeToString([]byte(content))}})
	return string(b)
}

// TestTenantImagesVolumes: image names, templates and volumes belong to
// the key that made them, over REST, E2B and MCP, with the keys in the
// state directory or on a shared PostgreSQL database. Key B pulls an
// image, makes a volume holding a secret, snapshots its sandbox as
// bapp:1 and builds btpl:1 from it. Key A then finds none of them, by
// name or by digest (or digest prefix): get, delete, create from, build
// FROM, mount, E2B templateID and MCP template are all refused like
// another key's sandbox, and its lists show nothing of B's. A's own
// snapshot, template and volume under the same names are A's: B's next
// sandbox from bapp:1 still has B's file, not A's, and B's volume still
// holds B's secret; A's same-named volume is empty. A's dashboard
// session gets the same 404s. Removing its own pull
// of the image B also pulled leaves B's, and B's cached RUN step is not
// A's. Published by the operator
// (airlock image publish --key), btpl:1 is readable by A (get, E2B
// create) and still not deletable; an operator image (made by the CLI,
// the format of every image from before owners) and a volume of the old
// layout are the operator's: no key sees them until published (volumes
// never).
func TestTenantImagesVolumes(t *testing.T) {
	needRoot(t)
	reg := it.Registry(t)
	ref := it.Push(t, reg, "tenant/busybox:1", it.Busybox(t))
	opRef := it.Push(t, reg, "tenant/operator:1", it.Image(t, it.TarLayer(t, it.Entry{Name: "etc/op", Type: tar.TypeReg, Data: "op"})))
	for _, backend := range []string{"state-dir", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			state := stateDir(t)
			args := []string{"--image-registry", reg}
			keyArgs := []string{"--state-dir", state}
			if backend == "postgres" {
				db := pgtest.Shared(t).NewDatabase(t)
				args = append(args, "--database-url", db)
				keyArgs = append(keyArgs, "--database-url", db)
			}
			s := startServer(t, state, args...)
			secretA, _ := keyWithID(t, append([]string{"--name", "a"}, keyArgs...)...)
			secretB, idB := keyWithID(t, append([]string{"--name", "b"}, keyArgs...)...)
			tenantImagesVolumes(t, s.URL, state, ref, opRef, secretA, secretB, idB)
		})
	}
}

func tenantImagesVolumes(t *testing.T, base, state, ref, opRef, secretA, secretB, idB string) {
	ctx := ctxT(t)
	ca, cb := client.New(base, secretA), client.New(base, secretB)
	as := func(secret string) func(method, path, body string) (int, string) {
		return func(method, path, body string) (int, string) {
			t.Helper()
			return tenantCall(t, method, base+path, "Authorization", secret, body)
		}
	}
	a, b := as(secretA), as(secretB)
	must := func(want int) func(code int, body string) string {
		return func(code int, body string) string {
			t.Helper()
			if code != want {
				t.Fatalf("%d %s, want %d", code, body, want)
			}
			return body
		}
	}
	digestOf := func(body string) string {
		var v struct {
			Digest string
			Image  *struct{ Digest string } // a template build's answer
		}
		json.Unmarshal([]byte(body), &v)
		if v.Image != nil {
			v.Digest = v.Image.Digest
		}
		if !strings.HasPrefix(v.Digest, "sha256:") {
			t.Fatalf("no digest in %s", body)
		}
		return v.Digest
	}
	sh := func(c *client.Client, id, script string) string {
		t.Helper()
		res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q: %+v %v", script, res, err)
		}
		return res.Stdout
	}

	// Key B's image, volume, snapshot and template.
	must(200)(b("POST", "/v1/images", `{"ref":"`+ref+`"}`))
	must(201)(b("POST", "/v1/volumes", `{"name":"bvol","size_bytes":16777216}`))
	sbB, err := cb.Create(ctx, client.CreateRequest{Image: ref, Volumes: []client.VolumeRef{{Name: "bvol", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	sh(cb, sbB.ID, "echo b-secret > /opt/secret && echo b-data > /data/secret")
	bapp := digestOf(must(201)(b("POST", "/v1/sandboxes/"+sbB.ID+"/snapshot", `{"name":"bapp:1"}`)))
	if err := cb.Kill(ctx, sbB.ID); err != nil {
		t.Fatal(err)
	}
	btpl := digestOf(must(201)(b("POST", "/v1/templates", templateBody("btpl:1", "bapp:1", "b-note"))))
	bref := digestOf(must(200)(b("GET", "/v1/images/"+ref, "")))
	hex := strings.TrimPrefix(btpl, "sha256:")

	// Key A pulls the same image: its own name, the same blobs.
	must(200)(a("POST", "/v1/images", `{"ref":"`+ref+`"}`))

	// Key A against B's objects: refused like another key's sandbox.
	vol := `"volumes":[{"name":"bvol","path":"/data"}]`
	for _, c := range []struct {
		what, method, path, body string
		want                     int
	}{
		{"get B's snapshot by name", "GET", "/v1/images/bapp:1", "", 404},
		{"get B's template by name", "GET", "/v1/images/btpl:1", "", 404},
		{"get B's template by digest", "GET", "/v1/images/" + url.PathEscape(btpl), "", 404},
		{"get B's template by digest prefix", "GET", "/v1/images/" + hex[:16], "", 404},
		{"get B's snapshot by digest", "GET", "/v1/images/" + url.PathEscape(bapp), "", 404},
		{"delete B's template by name", "DELETE", "/v1/images/btpl:1", "", 404},
		{"delete B's snapshot by digest", "DELETE", "/v1/images/" + url.PathEscape(bapp), "", 404},
		{"sandbox from B's template", "POST", "/v1/sandboxes", `{"image":"btpl:1"}`, 400},
		{"sandbox from B's digest", "POST", "/v1/sandboxes", `{"image":"` + btpl + `"}`, 400},
		{"sandbox from B's digest prefix", "POST", "/v1/sandboxes", `{"image":"` + hex[:16] + `"}`, 400},
		{"build FROM B's template", "POST", "/v1/templates", templateBody("steal:1", "btpl:1", "x"), 403},
		{"build FROM B's digest", "POST", "/v1/templates", templateBody("steal:2", btpl, "x"), 403},
		{"get B's volume", "GET", "/v1/volumes/bvol", "", 404},
		{"delete B's volume", "DELETE", "/v1/volumes/bvol", "", 404},
		{"mount B's volume", "POST", "/v1/sandboxes", `{` + vol + `}`, 400},
		{"mount B's volume in an image sandbox", "POST", "/v1/sandboxes", `{"image":"` + ref + `",` + vol + `}`, 400},
	} {
		if code, body := a(c.method, c.path, c.body); code != c.want {
			t.Errorf("key A, %s: %d %.300s, want %d", c.what, code, body, c.want)
		}
	}
	list := must(200)(a("GET", "/v1/images", ""))
	for _, leak := range []string{bapp, btpl, idB, "bapp", "btpl"} {
		if strings.Contains(list, leak) {
			t.Errorf("key A's image list shows B's %s: %.300s", leak, list)
		}
	}
	if list := must(200)(a("GET", "/v1/volumes", "")); strings.Contains(list, "bvol") {
		t.Errorf("key A's volume list shows B's volume: %s", list)
	}

	// E2B: B's template, by name or digest, is E2B's 404.
	for _, tpl := range []string{"btpl:1", btpl, hex[:16]} {
		code, body := tenantCall(t, "POST", base+"/sandboxes", "X-API-Key", secretA, `{"templateID":"`+tpl+`","timeout":60}`)
		if code != 404 {
			t.Errorf("key A, E2B create from B's template %s: %d %s, want 404", tpl, code, body)
		}
	}
	// MCP: create_sandbox with B's template is a tool error.
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "tenant", Version: "1"}, nil).Connect(ctx,
		&sdk.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: mcpBearer{secretA}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for _, tpl := range []string{"btpl:1", btpl} {
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "create_sandbox", Arguments: map[string]any{"template": tpl}})
		if err != nil {
			t.Fatal(err)
		}
		text := mcpText(res)
		if !res.IsError || !strings.Contains(text, "is not in the server's image store") {
			t.Errorf("key A, MCP create_sandbox from B's template %s: error %v: %s", tpl, res.IsError, text)
		}
	}

	// The dashboard calls the same API as the session's key.
	code, login, resp := dashReq(t, "POST", base+"/ui/session", "", "x", base, `{"key":"`+secretA+`"}`)
	if code != 200 {
		t.Fatalf("key A's dashboard login: %d %s", code, login)
	}
	var sess struct{ CSRF string }
	json.Unmarshal([]byte(login), &sess)
	var cookie string
	for _, c := range resp.Cookies() {
		if c.Name == "airlock_session" {
			cookie = c.Value
		}
	}
	for _, c := range []struct{ method, path string }{{"GET", "/v1/images/btpl:1"}, {"DELETE", "/v1/images/btpl:1"},
		{"GET", "/v1/images/" + url.PathEscape(btpl)}, {"GET", "/v1/volumes/bvol"}, {"DELETE", "/v1/volumes/bvol"}} {
		if code, body, _ := dashReq(t, c.method, base+c.path, cookie, sess.CSRF, base, ""); code != 404 {
			t.Errorf("key A's dashboard session, %s %s: %d %s, want 404", c.method, c.path, code, body)
		}
	}
	if code, body, _ := dashReq(t, "GET", base+"/v1/images", cookie, sess.CSRF, base, ""); code != 200 || strings.Contains(body, btpl) || strings.Contains(body, bapp) {
		t.Errorf("key A's dashboard session lists images: %d %s", code, body)
	}

	// Key A's own objects under B's names: its own namespace.
	must(201)(a("POST", "/v1/volumes", `{"name":"bvol","size_bytes":16777216}`))
	sbA, err := ca.Create(ctx, client.CreateRequest{Image: ref, Volumes: []client.VolumeRef{{Name: "bvol", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	if out := sh(ca, sbA.ID, "ls -A /data | grep -v lost+found; echo a-file > /opt/a-file; echo a-data > /data/a"); out != "" {
		t.Errorf("key A's own volume bvol holds %q: B's data?", out)
	}
	if d := digestOf(must(201)(a("POST", "/v1/sandboxes/"+sbA.ID+"/snapshot", `{"name":"bapp:1"}`))); d == bapp {
		t.Errorf("key A's snapshot bapp:1 has B's digest")
	}
	ca.Kill(ctx, sbA.ID)
	if d := digestOf(must(201)(a("POST", "/v1/templates", templateBody("btpl:1", ref, "a-note")))); d == btpl {
		t.Errorf("key A's template btpl:1 has B's digest")
	}
	// The build cache is per key: B's RUN step (random output) is not
	// handed to A building the same Dockerfile on the same base.
	randomStep := func(name string) string {
		b, _ := json.Marshal(map[string]any{"name": name, "dockerfile": "FROM " + ref + "\nRUN head -c 16 /dev/urandom | od -An -tx1 > /opt/rand\n"})
		return string(b)
	}
	var built struct {
		Image  struct{ Digest string }
		Cached int
	}
	json.Unmarshal([]byte(must(201)(b("POST", "/v1/templates", randomStep("brand:1")))), &built)
	bRand := built.Image.Digest
	json.Unmarshal([]byte(must(201)(a("POST", "/v1/templates", randomStep("arand:1")))), &built)
	if built.Cached != 0 || built.Image.Digest == bRand {
		t.Errorf("key A's build of B's Dockerfile took B's step from the cache: cached %d, digest %s (B's %s)", built.Cached, built.Image.Digest, bRand)
	}
	must(200)(a("DELETE", "/v1/images/"+ref, ""))

	// B's objects are untouched.
	for name, want := range map[string]string{"bapp:1": bapp, "btpl:1": btpl, ref: bref} {
		if d := digestOf(must(200)(b("GET", "/v1/images/"+name, ""))); d != want {
			t.Errorf("key B's %s is now %s, was %s", name, d, want)
		}
	}
	must(200)(b("GET", "/v1/volumes/bvol", ""))
	sbB2, err := cb.Create(ctx, client.CreateRequest{Image: "bapp:1", Volumes: []client.VolumeRef{{Name: "bvol", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	if out := sh(cb, sbB2.ID, "cat /opt/secret /data/secret; for f in /opt/a-file /data/a; do test -e $f && echo has $f; done; true"); out != "b-secret\nb-data\n" {
		t.Errorf("key B's sandbox from its bapp:1 with its bvol: %q (A's file or data?)", out)
	}
	cb.Kill(ctx, sbB2.ID)

	// Published: readable by A, never deletable by A.
	airlock := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(airlockBin(t), append([]string{"image"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("airlock image %v: %v\n%s", args, err, out)
		}
	}
	airlock("publish", "--state-dir", state, "--key", idB, "btpl:1")
	must(200)(a("DELETE", "/v1/images/btpl:1", "")) // A's own btpl:1
	body := must(200)(a("GET", "/v1/images/btpl:1", ""))
	if digestOf(body) != btpl || !strings.Contains(body, `"public":true`) {
		t.Errorf("key A, B's published btpl:1: %s", body)
	}
	must(404)(a("DELETE", "/v1/images/btpl:1", ""))
	must(404)(a("DELETE", "/v1/images/"+url.PathEscape(btpl), ""))
	if d := digestOf(must(200)(b("GET", "/v1/images/btpl:1", ""))); d != btpl {
		t.Errorf("B's published btpl:1 is now %s", d)
	}
	code, created := tenantCall(t, "POST", base+"/sandboxes", "X-API-Key", secretA, `{"templateID":"btpl:1","timeout":60}`)
	if code != 201 {
		t.Fatalf("key A, E2B create from the published btpl:1: %d %s", code, created)
	}
	var e2bSB struct{ SandboxID string }
	json.Unmarshal([]byte(created), &e2bSB)
	if out := sh(ca, e2bSB.SandboxID, "cat /opt/note"); out != "b-note" {
		t.Errorf("key A's sandbox from the published btpl:1: %q", out)
	}
	ca.Kill(ctx, e2bSB.SandboxID)

	// The operator's images (the CLI's, and every image from before
	// owners: no owner annotation) and volumes (the old layout).
	airlock("pull", "--state-dir", state, "--quiet", opRef)
	for _, c := range []func(string, string, string) (int, string){a, b} {
		must(404)(c("GET", "/v1/images/"+opRef, ""))
	}
	airlock("publish", "--state-dir", state, opRef)
	for _, c := range []func(string, string, string) (int, string){a, b} {
		if body := must(200)(c("GET", "/v1/images/"+opRef, "")); !strings.Contains(body, `"public":true`) {
			t.Errorf("the operator's published image: %s", body)
		}
		must(404)(c("DELETE", "/v1/images/"+opRef, ""))
	}
	vs, err := volume.Open(filepath.Join(state, "volumes"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vs.Create("legacy", 8<<20); err != nil {
		t.Fatal(err)
	}
	for _, c := range []func(string, string, string) (int, string){a, b} {
		must(404)(c("GET", "/v1/volumes/legacy", ""))
		must(404)(c("DELETE", "/v1/volumes/legacy", ""))
	}
	if _, err := vs.Get("legacy"); err != nil {
		t.Errorf("the operator's volume: %v", err)
	}
}

// mcpText joins a tool result's text.
func mcpText(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
