package e2b

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/store"
	"github.com/airlock-dev/airlock/volume"

	"github.com/airlock-dev/airlock/internal/testserver"
)

// airlockBinary builds the airlock binary (the sandboxes' agent) once.
func airlockBinary(t *testing.T) string { return testserver.Binary(t) }

// env is an E2B handler over a real manager, served by httptest.
type env struct {
	h          *Handler
	st         *store.Store
	m          *manager.Manager
	url        string
	key, other string
}

func newEnv(t *testing.T, sandboxes bool) *env {
	t.Helper()
	return newEnvWith(t, sandboxes, nil)
}

func newEnvWith(t *testing.T, sandboxes bool, in Interpreter) *env {
	t.Helper()
	return newEnvConfig(t, sandboxes, Config{Interpreter: in})
}

// newEnvConfig is newEnv with a handler configured as cfg (its Manager,
// Store and Logf are filled in).
func newEnvConfig(t *testing.T, sandboxes bool, cfg Config) *env {
	t.Helper()
	return newEnvSetup(t, sandboxes, envSetup{Config: cfg})
}

// envSetup configures newEnvSetup: the handler's Config, and prepare, run
// on the fresh state directory before anything opens it.
type envSetup struct {
	Config
	prepare func(t *testing.T, dir string)
	images  *imagestore.Store // the manager's image store, if any
	egress  manager.EgressConfig
	volumes bool           // give the manager a volume store
	runtime policy.Runtime // the manager's default runtime; "" native
}

func newEnvSetup(t *testing.T, sandboxes bool, cfg envSetup) *env {
	t.Helper()
	bin := "/nonexistent/airlock"
	if sandboxes {
		if os.Geteuid() != 0 {
			t.Skip("needs root (cgroups, uid ranges); CI runs as root")
		}
		bin = airlockBinary(t)
	}
	dir, err := os.MkdirTemp("", "al")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if cfg.prepare != nil {
		cfg.prepare(t, dir)
	}
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var vs *volume.Store
	if cfg.volumes {
		if vs, err = volume.Open(filepath.Join(dir, "volumes")); err != nil {
			t.Fatal(err)
		}
	}
	m, err := manager.Open(manager.Config{Volumes: vs, StateDir: dir, Store: st, Images: cfg.images, AgentBinary: bin, Logf: t.Logf, DefaultRuntime: cfg.runtime, Egress: cfg.egress})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	cfg.Manager, cfg.Store, cfg.Logf = m, st, t.Logf
	h, err := NewHandler(cfg.Config)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	_, key, err := st.CreateKey(context.Background(), "a", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, other, err := st.CreateKey(context.Background(), "b", 0)
	if err != nil {
		t.Fatal(err)
	}
	return &env{h: h, st: st, m: m, url: srv.URL, key: key, other: other}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("status %d body %q: %v", r.status, r.body, err)
	}
}

// apiErr checks E2B's {"code", "message"} error body.
func (r reply) apiErr(t *testing.T, status int) string {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if r.status != status {
		t.Fatalf("status %d, want %d (body %q)", r.status, status, r.body)
	}
	r.json(t, &e)
	if e.Code != status || e.Message == "" {
		t.Fatalf("error body %q", r.body)
	}
	return e.Message
}

func (e *env) do(t *testing.T, method, path string, hdr map[string]string, body []byte) reply {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *env) api(t *testing.T, method, path, key, body string) reply {
	t.Helper()
	hdr := map[string]string{"Content-Type": "application/json"}
	if key != "" {
		hdr["X-API-KEY"] = key
	}
	return e.do(t, method, path, hdr, []byte(body))
}

func TestControlPlaneAuthAndErrors(t *testing.T) {
	e := newEnv(t, false)
	e.api(t, "GET", "/v2/sandboxes", "", "").apiErr(t, 401)
	e.api(t, "GET", "/v2/sandboxes", "al_not-a-key", "").apiErr(t, 401)
	e.do(t, "GET", "/v2/sandboxes", map[string]string{"Authorization": "Bearer " + e.key}, nil)
	r := e.api(t, "GET", "/v2/sandboxes", e.key, "")
	if r.status != 200 || strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("empty list: %d %q", r.status, r.body)
	}
	for _, path := range []string{"/sandboxes/sb-0123456789abcdef", "/sandboxes/sb-0123456789abcdef/metrics"} {
		e.api(t, "GET", path, e.key, "").apiErr(t, 404)
	}
	e.api(t, "DELETE", "/sandboxes/sb-0123456789abcdef", e.key, "").apiErr(t, 404)
	e.api(t, "POST", "/sandboxes/sb-0123456789abcdef/timeout", e.key, `{"timeout":30}`).apiErr(t, 404)
	e.api(t, "POST", "/sandboxes/sb-0123456789abcdef/pause", e.key, `{}`).apiErr(t, 404)
	e.api(t, "GET", "/templates", e.key, "").apiErr(t, 501)
	if msg := e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"no-such-template"}`).apiErr(t, 404); !strings.Contains(msg, "template 'no-such-template' not found") {
		t.Errorf("unknown template: %q", msg)
	}
	for _, body := range []string{
		`{"templateID":"base","network":{"allowOut":["a.com"],"denyOut":["1.2.3.4"]}}`,
		`{"templateID":"base","network":{"egressProxy":{"address":"proxy:1080"}}}`,
		`{"templateID":"base","network":{"httpsPorts":[8443]}}`,
		`{"templateID":"base","network":{"denyOut":["0.0.0.0/0"],"allowOut":["not a host!"]}}`,
		`{"templateID":"base","metadata":{"airlock.pause_memory":"false"}}`,
		`{"templateID":"base","metadata":{"airlock.on_timeout":"pause"}}`,
		`{"templateID":"base","metadata":{"e2b.auto_resume":"true"}}`,
		`{"templateID":"base","mcp":{"x":{}}}`,
		`{"templateID":"base","volumeMounts":[{"name":"v","path":"/data"}]}`,
		`{"templateID":"base","metadata":{"e2b.template":"x"}}`,
		`{"templateID":"base","timeout":-1}`,
		`{"templateID":"base","timeout":"x"}`,
		`{"templateID":`,
	} {
		msg := e.api(t, "POST", "/v2/sandboxes", e.key, body).apiErr(t, 400)
		t.Logf("%s: %s", body, msg)
	}
	e.api(t, "POST", "/v2/sandboxes", e.key, strings.Repeat(" ", 2<<20)).apiErr(t, 413)
	e.api(t, "GET", "/v2/sandboxes?metadata=a%3D1%26a%3D2", e.key, "").apiErr(t, 400)
	e.api(t, "GET", "/v2/sandboxes?state=stopped", e.key, "").apiErr(t, 400)
	e.api(t, "GET", "/v2/sandboxes?nextToken=%21%21", e.key, "").apiErr(t, 400)
	e.api(t, "GET", "/v2/sandboxes?limit=0", e.key, "").apiErr(t, 400)
	if r := e.api(t, "GET", "/v2/sandboxes?state=paused", e.key, ""); r.status != 200 || strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("paused: %d %q", r.status, r.body)
	}
}

// TestTemplateAliasKnown: Template.exists / aliasExists (GET
// /templates/aliases/{alias}) says yes to every name a create takes, E2B's
// well-known templates and airlock's profiles included (E2B's own suite
// checks Template.exists('base')), and no to others, only for a key.
func TestTemplateAliasKnown(t *testing.T) {
	e := newEnv(t, false)
	for _, name := range []string{"base", "code-interpreter-v1", "standard"} {
		r := e.api(t, "GET", "/templates/aliases/"+name, e.key, "")
		var got struct {
			TemplateID string `json:"templateID"`
			Public     bool   `json:"public"`
		}
		r.json(t, &got)
		if r.status != 200 || got.TemplateID != name || !got.Public {
			t.Errorf("alias %s: %d %s, want 200, public", name, r.status, r.body)
		}
	}
	for _, name := range []string{"no-such-template", "base:other", "..%2Fbase"} {
		e.api(t, "GET", "/templates/aliases/"+name, e.key, "").apiErr(t, 404)
	}
	e.api(t, "GET", "/templates/aliases/base", "", "").apiErr(t, 401)
}

// TestOldSDKCreateBodies sends the create bodies of e2b 2.39 (autoResume
// {"enabled": false}, autoPause false, allow_internet_access true, secure)
// and checks they create sandboxes, with internet access as they asked,
// and that the E2B form of a key (e2b_ and hex) authenticates as the key.
func TestOldSDKCreateBodies(t *testing.T) {
	e := newEnv(t, true)
	e2bKey, err := E2BKey(e.key)
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"templateID":"base","timeout":30,"secure":true,"allow_internet_access":true,"autoPause":false,"autoResume":{"enabled":false}}`,
		`{"templateID":"base","autoResume":false}`,
	} {
		r := e.api(t, "POST", "/sandboxes", e2bKey, body)
		var c sandboxCreated
		if r.status != 201 {
			t.Fatalf("%s: status %d %q", body, r.status, r.body)
		}
		r.json(t, &c)
		var d sandboxDetail
		e.api(t, "GET", "/sandboxes/"+c.SandboxID, e.key, "").json(t, &d)
		want := strings.Contains(body, `"allow_internet_access":true`)
		if d.AllowInternetAccess == nil || *d.AllowInternetAccess != want {
			t.Fatalf("%s: allowInternetAccess %v, want %v", body, d.AllowInternetAccess, want)
		}
		if r := e.api(t, "DELETE", "/sandboxes/"+c.SandboxID, e2bKey, ""); r.status != 204 {
			t.Fatalf("kill with the E2B form of the key: %d %q", r.status, r.body)
		}
	}
	// The E2B form of another key, or a malformed one, is not this key.
	otherE2B, _ := E2BKey(e.other)
	var list []sandboxDetail
	e.api(t, "GET", "/v2/sandboxes", otherE2B, "").json(t, &list)
	e.api(t, "GET", "/v2/sandboxes", "e2b_"+strings.Repeat("0", 64), "").apiErr(t, 401)
	e.api(t, "GET", "/v2/sandboxes", "e2b_"+strings.Repeat("zz", 32), "").apiErr(t, 401)
}

// TestNetworkCap checks Config.MaxNetwork (airlock serve
// --e2b-max-network): creates and updates asking for more network than it
// allows are refused with a 403 that names the flag; less is served.
func TestNetworkCap(t *testing.T) {
	e := newEnvConfig(t, true, Config{MaxNetwork: "allowlist"})
	for _, body := range []string{
		`{"templateID":"base","allow_internet_access":true}`,
		`{"templateID":"base","network":{"denyOut":["10.0.0.0/8"]}}`,
	} {
		msg := e.api(t, "POST", "/v2/sandboxes", e.key, body).apiErr(t, 403)
		if !strings.Contains(msg, "--e2b-max-network") {
			t.Fatalf("%s: message %q does not name the flag", body, msg)
		}
	}
	r := e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base","network":{"denyOut":["0.0.0.0/0"],"allowOut":["pypi.org"]}}`)
	if r.status != 201 {
		t.Fatalf("allowlist under an allowlist cap: %d %q", r.status, r.body)
	}
	var c sandboxCreated
	r.json(t, &c)
	defer e.api(t, "DELETE", "/sandboxes/"+c.SandboxID, e.key, "")
	e.api(t, "PUT", "/sandboxes/"+c.SandboxID+"/network", e.key, `{}`).apiErr(t, 403)
	var d sandboxDetail
	e.api(t, "GET", "/sandboxes/"+c.SandboxID, e.key, "").json(t, &d)
	if fmt.Sprint(d.Network["allowOut"]) != "[pypi.org]" {
		t.Fatalf("network after a refused update: %v", d.Network)
	}
	if _, err := NewHandler(Config{Manager: e.m, Store: e.st, MaxNetwork: "wide"}); err == nil {
		t.Fatal("NewHandler accepted MaxNetwork \"wide\"")
	}
}

func TestSandboxPortAuth(t *testing.T) {
	e := newEnv(t, false)
	id := "sb-0123456789abcdef"
	port := func(p string, hdr map[string]string) map[string]string {
		m := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": p}
		for k, v := range hdr {
			m[k] = v
		}
		return m
	}
	// No token, a wrong token, another sandbox's token: 401 before any
	// lookup.
	e.do(t, "GET", "/health", port("49983", nil), nil).apiErr(t, 401)
	e.do(t, "GET", "/health", port("49983", map[string]string{"X-Access-Token": "x"}), nil).apiErr(t, 401)
	e.do(t, "GET", "/health", port("49983", map[string]string{"X-Access-Token": e.h.envdToken("sb-other")}), nil).apiErr(t, 401)
	e.do(t, "GET", "/health", port("49983", map[string]string{"X-Access-Token": e.h.trafficToken(id)}), nil).apiErr(t, 401)
	e.do(t, "POST", "/execute", port("49999", map[string]string{"E2b-Traffic-Access-Token": e.h.envdToken(id)}), nil).apiErr(t, 401)
	// The right token for a sandbox that does not run: E2B's 502.
	e.do(t, "GET", "/health", port("49983", map[string]string{"X-Access-Token": e.h.envdToken(id)}), nil).apiErr(t, 502)
	e.do(t, "POST", "/contexts", port("49999", map[string]string{"E2b-Traffic-Access-Token": e.h.trafficToken(id)}), nil).apiErr(t, 502)
	// A port of the sandbox's own: E2B's proxy's 403 for a private sandbox.
	e.do(t, "GET", "/", port("8080", nil), nil).apiErr(t, 403)
	e.do(t, "GET", "/", port("8080", map[string]string{"E2b-Traffic-Access-Token": e.h.trafficToken("sb-other")}), nil).apiErr(t, 403)
	e.do(t, "GET", "/", port("8080", map[string]string{"E2b-Traffic-Access-Token": e.h.trafficToken(id)}), nil).apiErr(t, 502)
	e.do(t, "GET", "/", port("70000", map[string]string{"E2b-Traffic-Access-Token": e.h.trafficToken(id)}), nil).apiErr(t, 400)
	e.do(t, "GET", "/", port("x", nil), nil).apiErr(t, 400)
}

func TestTokensSurviveRestart(t *testing.T) {
	e := newEnv(t, false)
	h2, err := NewHandler(Config{Manager: e.m, Store: e.st})
	if err != nil {
		t.Fatal(err)
	}
	if h2.envdToken("sb-1") != e.h.envdToken("sb-1") || e.h.envdToken("sb-1") == e.h.envdToken("sb-2") ||
		e.h.envdToken("sb-1") == e.h.trafficToken("sb-1") {
		t.Fatal("tokens are not stable per sandbox and kind")
	}
	fi, err := os.Stat(filepath.Join(filepath.Dir(e.st.Path()), "e2b.key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token key: %v %v", fi, err)
	}
}

// rpc makes a unary Connect call to envd.
func (e *env) rpc(t *testing.T, id, method, body string, hdr map[string]string) reply {
	t.Helper()
	h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": e.h.envdToken(id),
		"Content-Type": "application/json"}
	for k, v := range hdr {
		h[k] = v
	}
	return e.do(t, "POST", "/"+method, h, []byte(body))
}

func (r reply) rpcErr(t *testing.T, code Code) {
	t.Helper()
	var ce Error
	r.json(t, &ce)
	if ce.Code != code || r.status != code.HTTPStatus() {
		t.Fatalf("status %d body %q, want %s", r.status, r.body, code)
	}
}

// stream makes a server-streaming Connect call and returns its messages
// and end-stream error.
func (e *env) stream(t *testing.T, id, method, body string, hdr map[string]string) ([]string, *Error) {
	t.Helper()
	h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": e.h.envdToken(id),
		"Content-Type": "application/connect+json"}
	for k, v := range hdr {
		h[k] = v
	}
	r := e.do(t, "POST", "/"+method, h, AppendEnvelope(nil, 0, []byte(body)))
	if r.status != 200 {
		t.Fatalf("stream status %d: %q", r.status, r.body)
	}
	msgs, end := readStream(t, r.body)
	return msgs, end.Error
}

func TestEnvdAgainstASandbox(t *testing.T) {
	e := newEnv(t, true)
	var created sandboxCreated
	r := e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base","metadata":{"k":"v"},"envVars":{"A":"b"}}`)
	if r.status != 201 {
		t.Fatalf("create: %d %q", r.status, r.body)
	}
	r.json(t, &created)
	id := created.SandboxID
	if created.EnvdAccessToken != e.h.envdToken(id) || created.EnvdVersion != EnvdVersion || created.TemplateID != "base" {
		t.Fatalf("created %+v", created)
	}

	// Another key sees nothing of it.
	e.api(t, "GET", "/sandboxes/"+id, e.other, "").apiErr(t, 404)
	e.api(t, "DELETE", "/sandboxes/"+id, e.other, "").apiErr(t, 404)
	e.api(t, "POST", "/v2/sandboxes/"+id+"/connect", e.other, `{}`).apiErr(t, 404)
	if r := e.api(t, "GET", "/v2/sandboxes", e.other, ""); strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("other key lists %q", r.body)
	}

	// File operations stay in the workspace and /tmp; only "user" exists.
	e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"/etc/passwd"}`, nil).rpcErr(t, CodeInvalidArgument)
	e.rpc(t, id, "filesystem.Filesystem/ListDir", `{"path":"/home/user/../../proc"}`, nil).rpcErr(t, CodeInvalidArgument)
	e.rpc(t, id, "filesystem.Filesystem/Remove", `{"path":"/home/user"}`, nil).rpcErr(t, CodeInvalidArgument)
	e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"/home/user/nope"}`, nil).rpcErr(t, CodeNotFound)
	e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"/home/user"}`, map[string]string{"Authorization": "Basic cm9vdDo="}).rpcErr(t, CodeUnauthenticated)
	e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"a\u0000b"}`, nil).rpcErr(t, CodeInvalidArgument)
	e.rpc(t, id, "filesystem.Filesystem/Nope", `{}`, nil).rpcErr(t, CodeUnimplemented)
	envd := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": e.h.envdToken(id)}
	e.do(t, "GET", "/files?path=/etc/passwd", envd, nil).apiErr(t, 400)
	e.do(t, "GET", "/files?path=/home/user/missing", envd, nil).apiErr(t, 404)
	e.do(t, "GET", "/files?path=/home/user&username=root", envd, nil).apiErr(t, 401)
	e.do(t, "GET", "/files?path=/home/user", envd, nil).apiErr(t, 400)
	up := map[string]string{"Content-Type": "application/octet-stream"}
	for k, v := range envd {
		up[k] = v
	}
	if r := e.do(t, "POST", "/files?path=/home/user/x/y.txt", up, []byte("data")); r.status != 200 ||
		!strings.Contains(string(r.body), `"path":"/home/user/x/y.txt"`) {
		t.Fatalf("octet-stream upload: %d %q", r.status, r.body)
	}
	if r := e.do(t, "GET", "/files?path=x/y.txt", envd, nil); r.status != 200 || string(r.body) != "data" || r.header.Get("Content-Length") != "4" {
		t.Fatalf("download: %d %q %v", r.status, r.body, r.header)
	}
	// File metadata (envd 0.6.2): X-Metadata-* headers, lower-cased keys,
	// in the answer and in Stat; a rewrite without them clears them;
	// non-ASCII is refused.
	up["X-Metadata-Owner"] = "me"
	if r := e.do(t, "POST", "/files?path=/home/user/z", up, []byte("d")); r.status != 200 || !strings.Contains(string(r.body), `"metadata":{"owner":"me"}`) {
		t.Fatalf("upload with metadata: %d %s", r.status, r.body)
	}
	if r := e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"/home/user/z"}`, nil); !strings.Contains(string(r.body), `"metadata":{"owner":"me"}`) {
		t.Fatalf("stat of a file with metadata: %s", r.body)
	}
	up["X-Metadata-Bad"] = "caf\u00e9"
	e.do(t, "POST", "/files?path=/home/user/z", up, []byte("d")).apiErr(t, 400)
	delete(up, "X-Metadata-Bad")
	delete(up, "X-Metadata-Owner")
	if r := e.do(t, "POST", "/files?path=/home/user/z", up, []byte("d")); r.status != 200 {
		t.Fatalf("rewrite: %d %s", r.status, r.body)
	}
	if r := e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"/home/user/z"}`, nil); strings.Contains(string(r.body), `"metadata"`) {
		t.Fatalf("a rewrite without metadata kept it: %s", r.body)
	}

	// Several files in one multipart upload land at their own paths; with
	// the path parameter they would all land on it, which is refused as
	// envd refuses it.
	multipartBody := func(files ...string) (string, []byte) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		for _, f := range files {
			h := textproto.MIMEHeader{}
			h.Set("Content-Disposition", `form-data; name="file"; filename="`+f+`"`)
			pw, _ := mw.CreatePart(h)
			pw.Write([]byte("content of " + f))
		}
		mw.Close()
		return mw.FormDataContentType(), buf.Bytes()
	}
	ct, body := multipartBody("multi/one.txt", "/home/user/multi2/two.txt", "/tmp/three.txt")
	mp := map[string]string{"Content-Type": ct}
	for k, v := range envd {
		mp[k] = v
	}
	if r := e.do(t, "POST", "/files", mp, body); r.status != 200 {
		t.Fatalf("multipart upload: %d %q", r.status, r.body)
	}
	for _, f := range []string{"/home/user/multi/one.txt", "/home/user/multi2/two.txt", "/tmp/three.txt"} {
		want := "content of " + strings.TrimPrefix(f, "/home/user/")
		if f == "/tmp/three.txt" || f == "/home/user/multi2/two.txt" {
			want = "content of " + f
		}
		if r := e.do(t, "GET", "/files?path="+f, envd, nil); r.status != 200 || string(r.body) != want {
			t.Fatalf("%s after a multipart upload: %d %q", f, r.status, r.body)
		}
	}
	ct, body = multipartBody("a.txt", "b.txt")
	mp["Content-Type"] = ct
	if msg := e.do(t, "POST", "/files?path=/home/user/same.txt", mp, body).apiErr(t, 400); !strings.Contains(msg, "same path") {
		t.Fatalf("two parts to one path: %q", msg)
	}

	// Processes: a command on a terminal sees one and its output comes as
	// pty data; bad sizes are refused; a missing pid is not found, and
	// Connect-Timeout-Ms kills the command like envd does. Its output is
	// the last thing it does (agent.TestPtyLastOutput: none is lost).
	msgs, err := e.stream(t, id, "process.Process/Start", `{"process":{"cmd":"/bin/sh","args":["-c","tty; stty size"]},"pty":{"size":{"cols":91,"rows":17}}}`, nil)
	if err != nil {
		t.Fatalf("pty start: %q %+v", msgs, err)
	}
	var ptyOut []byte
	for _, m := range msgs {
		var ev struct {
			Event struct {
				Data *struct{ Pty []byte } `json:"data"`
			} `json:"event"`
		}
		if json.Unmarshal([]byte(m), &ev) == nil && ev.Event.Data != nil {
			ptyOut = append(ptyOut, ev.Event.Data.Pty...)
		}
	}
	if !strings.Contains(string(ptyOut), "/dev/pts/") || !strings.Contains(string(ptyOut), "17 91") {
		t.Fatalf("pty output %q", ptyOut)
	}
	for _, size := range []string{`{"cols":0,"rows":24}`, `{"cols":80,"rows":5000}`} {
		if _, err := e.stream(t, id, "process.Process/Start", `{"process":{"cmd":"/bin/true"},"pty":{"size":`+size+`}}`, nil); err == nil || err.Code != CodeInvalidArgument {
			t.Fatalf("pty size %s: %+v", size, err)
		}
	}
	e.rpc(t, id, "process.Process/Update", `{"process":{"pid":99999},"pty":{"size":{"cols":80,"rows":24}}}`, nil).rpcErr(t, CodeNotFound)
	if _, err := e.stream(t, id, "process.Process/Connect", `{"process":{"pid":99999}}`, nil); err == nil || err.Code != CodeNotFound {
		t.Fatalf("connect to a missing pid: %+v", err)
	}
	e.rpc(t, id, "process.Process/SendSignal", `{"process":{"pid":99999},"signal":"SIGNAL_SIGKILL"}`, nil).rpcErr(t, CodeNotFound)
	e.rpc(t, id, "process.Process/SendSignal", `{"process":{"pid":1},"signal":"SIGNAL_SIGKILL"}`, nil).rpcErr(t, CodeNotFound)
	e.rpc(t, id, "process.Process/SendInput", `{"process":{"pid":1,"tag":"x"},"input":{"stdin":"aGk="}}`, nil).rpcErr(t, CodeInvalidArgument)
	t0 := time.Now()
	msgs, err = e.stream(t, id, "process.Process/Start", `{"process":{"cmd":"/bin/sleep","args":["30"]},"stdin":false}`,
		map[string]string{"Connect-Timeout-Ms": "300"})
	if err == nil || err.Code != CodeDeadlineExceeded || len(msgs) == 0 || !strings.Contains(msgs[0], `"start"`) {
		t.Fatalf("timed-out command: %q %+v", msgs, err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var list listResponse
		e.rpc(t, id, "process.Process/List", `{}`, nil).json(t, &list)
		if len(list.Processes) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the timed-out command still runs: %+v", list.Processes)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Keepalives at the interval the client asks for while a command is
	// quiet.
	msgs, err = e.stream(t, id, "process.Process/Start", `{"process":{"cmd":"/bin/sleep","args":["2.5"]},"stdin":false}`,
		map[string]string{"Keepalive-Ping-Interval": "1"})
	if err != nil || len(msgs) < 4 || msgs[1] != `{"event":{"keepalive":{}}}` || !strings.Contains(msgs[len(msgs)-1], `"end"`) {
		t.Fatalf("keepalives: %q %+v", msgs, err)
	}
	msgs, err = e.stream(t, id, "process.Process/Start", `{"process":{"cmd":"/bin/sh","args":["-c","echo $A; exit 4"]},"stdin":false}`, nil)
	if err != nil || len(msgs) != 3 || msgs[1] != `{"event":{"data":{"stdout":"Ygo="}}}` ||
		msgs[2] != `{"event":{"end":{"exitCode":4,"exited":true,"status":"exit status 4","error":"exit status 4"}}}` {
		t.Fatalf("echo: %q %+v", msgs, err)
	}

	// A gzip-compressed octet-stream upload.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("unzipped"))
	zw.Close()
	up["Content-Encoding"] = "gzip"
	if r := e.do(t, "POST", "/files?path=gz.txt", up, gz.Bytes()); r.status != 200 {
		t.Fatalf("gzip upload: %d %q", r.status, r.body)
	}
	if r := e.do(t, "GET", "/files?path=/home/user/gz.txt", envd, nil); string(r.body) != "unzipped" {
		t.Fatalf("gzip upload wrote %q", r.body)
	}

	// The Python SDK's polling watchers.
	var cw createWatcherResponse
	e.rpc(t, id, "filesystem.Filesystem/CreateWatcher", `{"path":"/home/user","recursive":true}`, nil).json(t, &cw)
	if r := e.do(t, "POST", "/files?path=/home/user/x/new.txt", up, gz.Bytes()); r.status != 200 {
		t.Fatalf("upload: %d %q", r.status, r.body)
	}
	var got []filesystemEvent
	for i := 0; i < 40 && len(got) == 0; i++ {
		time.Sleep(100 * time.Millisecond)
		var ev struct {
			Events []struct {
				Name string `json:"name"`
				Type string `json:"type"`
			} `json:"events"`
		}
		e.rpc(t, id, "filesystem.Filesystem/GetWatcherEvents", `{"watcherId":"`+cw.WatcherID+`"}`, nil).json(t, &ev)
		for _, x := range ev.Events {
			if x.Name == "x/new.txt" && x.Type == "EVENT_TYPE_CREATE" {
				got = append(got, filesystemEvent{Name: x.Name})
			}
		}
	}
	if len(got) == 0 {
		t.Fatal("watcher saw no creation of x/new.txt")
	}
	e.rpc(t, id, "filesystem.Filesystem/RemoveWatcher", `{"watcher_id":"`+cw.WatcherID+`"}`, nil)
	e.rpc(t, id, "filesystem.Filesystem/GetWatcherEvents", `{"watcherId":"`+cw.WatcherID+`"}`, nil).rpcErr(t, CodeNotFound)

	// A process started through airlock's own API (the agent directly)
	// can be listed and connected to.
	sb, lerr := e.m.Lookup(e.h.mustOwner(t, id), id)
	if lerr != nil {
		t.Fatal(lerr)
	}
	p, xerr := sb.Agent().Exec(context.Background(), agent.ExecRequest{Shell: "echo from-api; read x", StdinOpen: true, Background: true, Tag: "api"})
	if xerr != nil {
		t.Fatal(xerr)
	}
	p.Close()
	var list listResponse
	e.rpc(t, id, "process.Process/List", `{}`, nil).json(t, &list)
	if len(list.Processes) != 1 || list.Processes[0].Tag == nil || *list.Processes[0].Tag != "api" {
		t.Fatalf("list: %+v", list)
	}
	go func() {
		// Not e.rpc: t.Fatal must not be called off the test goroutine.
		time.Sleep(300 * time.Millisecond)
		req, _ := http.NewRequest("POST", e.url+"/process.Process/CloseStdin", strings.NewReader(`{"process":{"tag":"api"}}`))
		for k, v := range map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983",
			"X-Access-Token": e.h.envdToken(id), "Content-Type": "application/json"} {
			req.Header.Set(k, v)
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	msgs, err = e.stream(t, id, "process.Process/Connect", fmt.Sprintf(`{"process":{"pid":%d}}`, p.Pid), nil)
	if err != nil || len(msgs) < 3 || !strings.Contains(strings.Join(msgs, ""), base64.StdEncoding.EncodeToString([]byte("from-api\n"))) {
		t.Fatalf("connect to an API process: %q %+v", msgs, err)
	}

	// Metrics and the list's filters and paging.
	var mt []map[string]any
	e.api(t, "GET", "/sandboxes/"+id+"/metrics", e.key, "").json(t, &mt)
	if len(mt) != 1 || mt[0]["memUsed"].(float64) <= 0 || mt[0]["cpuCount"].(float64) < 1 {
		t.Fatalf("metrics %v", mt)
	}
	r = e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"strict","metadata":{"k":"w"},
		"network":{"denyOut":["0.0.0.0/0"],"allowOut":["pypi.org","*.pythonhosted.org"]}}`)
	var second sandboxCreated
	r.json(t, &second)
	var info struct {
		AllowInternetAccess *bool `json:"allowInternetAccess"`
		Network             struct {
			AllowOut []string `json:"allowOut"`
			DenyOut  []string `json:"denyOut"`
		} `json:"network"`
	}
	e.api(t, "GET", "/sandboxes/"+second.SandboxID, e.key, "").json(t, &info)
	if info.AllowInternetAccess != nil || strings.Join(info.Network.AllowOut, ",") != "pypi.org,*.pythonhosted.org" ||
		strings.Join(info.Network.DenyOut, ",") != "0.0.0.0/0" {
		t.Fatalf("network of an allowlisted sandbox: %+v", info)
	}
	if r := e.api(t, "PUT", "/sandboxes/"+second.SandboxID+"/network", e.key, `{"allow_internet_access":false}`); r.status != 204 {
		t.Fatalf("updateNetwork: %d %q", r.status, r.body)
	}
	if ni, err := e.m.Network(context.Background(), e.h.mustOwner(t, id), second.SandboxID); err != nil || ni.Mode != "none" {
		t.Fatalf("network after update: %+v %v", ni, err)
	}
	e.api(t, "PUT", "/sandboxes/"+second.SandboxID+"/network", e.key, `{"rules":{"a.com":[{"transform":{"headers":{"X":"y"}}}]}}`).apiErr(t, 400)
	e.api(t, "GET", "/sandboxes/"+id, e.key, "").json(t, &info)
	if info.AllowInternetAccess == nil || *info.AllowInternetAccess {
		t.Fatalf("network of a default sandbox: %+v", info)
	}
	for q, want := range map[string]string{
		"metadata=k%3Dv":               id,
		"metadata=k%3Dw":               second.SandboxID,
		"template=strict":              second.SandboxID,
		"template=base&metadata=k%3Dw": "",
		"order=asc&limit=1":            id,
		"order=desc&limit=1":           second.SandboxID,
	} {
		var l []sandboxDetail
		r := e.api(t, "GET", "/v2/sandboxes?"+q, e.key, "")
		r.json(t, &l)
		ids := make([]string, 0, len(l))
		for _, d := range l {
			ids = append(ids, d.SandboxID)
		}
		if strings.Join(ids, ",") != want {
			t.Errorf("%s: %v, want %s", q, ids, want)
		}
		if strings.Contains(q, "limit=1") {
			var rest []sandboxDetail
			e.api(t, "GET", "/v2/sandboxes?"+q+"&nextToken="+r.header.Get("X-Next-Token"), e.key, "").json(t, &rest)
			if r.header.Get("X-Next-Token") == "" || len(rest) != 1 || rest[0].SandboxID == want {
				t.Errorf("%s: second page %+v (token %q)", q, rest, r.header.Get("X-Next-Token"))
			}
		}
	}

	// Killed: the control plane says 404, the sandbox ports 502.
	if r := e.api(t, "DELETE", "/sandboxes/"+id, e.key, ""); r.status != 204 {
		t.Fatalf("kill: %d %q", r.status, r.body)
	}
	e.api(t, "GET", "/sandboxes/"+id, e.key, "").apiErr(t, 404)
	e.api(t, "DELETE", "/sandboxes/"+id, e.key, "").apiErr(t, 404)
	e.do(t, "GET", "/health", envd, nil).apiErr(t, 502)
}

// mustOwner returns the owner the handler knows for a sandbox.
func (h *Handler) mustOwner(t *testing.T, id string) string {
	t.Helper()
	o, ok := h.ownerOf(context.Background(), id)
	if !ok {
		t.Fatalf("no owner for %s", id)
	}
	return o
}

// TestPortsThroughAgent reaches a web server inside a sandbox (Python's
// http.server on its loopback) with E2b-Sandbox-Port, as getHost users do:
// the request and the answer cross the agent, the sandbox has no network.
//
// With a domain (airlock serve --e2b-domain), the same request by host,
// PORT-SANDBOXID.DOMAIN, as the SDKs' getHost(port) names it.
func TestPortsThroughAgent(t *testing.T) {
	e := newEnvConfig(t, true, Config{Domain: "sandboxes.test"})
	var c sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base"}`).json(t, &c)
	if c.Domain == nil || *c.Domain != "sandboxes.test" {
		t.Fatalf("created: domain %v", c.Domain)
	}
	defer e.api(t, "DELETE", "/sandboxes/"+c.SandboxID, e.key, "")
	ctx := context.Background()
	owner, _ := e.h.ownerOf(ctx, c.SandboxID)
	sb, err := e.m.Lookup(owner, c.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Agent().WriteFile(ctx, "/workspace/site/hello.txt", strings.NewReader("hello from the sandbox"), 0); err != nil {
		t.Fatal(err)
	}
	hdr := map[string]string{"E2b-Sandbox-Id": c.SandboxID, "E2b-Sandbox-Port": "8765", "E2b-Traffic-Access-Token": c.TrafficAccessToken}
	if msg := e.do(t, "GET", "/hello.txt", hdr, nil).apiErr(t, 502); !strings.Contains(msg, "nothing listens on port 8765") {
		t.Fatalf("closed port: %q", msg)
	}
	p, err := sb.Agent().Exec(ctx, agent.ExecRequest{Argv: []string{"python3", "-m", "http.server", "--bind", "127.0.0.1", "8765"},
		Cwd: "/workspace/site", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var r reply
	for i := 0; i < 200; i++ { // until the server listens
		if r = e.do(t, "GET", "/hello.txt", hdr, nil); r.status != http.StatusBadGateway {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.status != 200 || string(r.body) != "hello from the sandbox" || r.header.Get("Server") == "" {
		t.Fatalf("GET through the agent: %d %v %q", r.status, r.header, r.body)
	}
	// A request body travels in; a missing file is the server's own 404.
	if r := e.do(t, "GET", "/missing", hdr, nil); r.status != 404 || !strings.Contains(string(r.body), "File not found") {
		t.Fatalf("missing file: %d %q", r.status, r.body)
	}
	big := strings.Repeat("x", 3<<20)
	if _, err := sb.Agent().WriteFile(ctx, "/workspace/site/big.txt", strings.NewReader(big), 0); err != nil {
		t.Fatal(err)
	}
	if r := e.do(t, "GET", "/big.txt", hdr, nil); r.status != 200 || len(r.body) != len(big) {
		t.Fatalf("3 MiB through the agent: %d, %d bytes", r.status, len(r.body))
	}
	// By host: what getHost(8765) returns, then envd by host too.
	jsDir, _ := filepath.Abs("../tests/js")
	host := "8765-" + c.SandboxID + ".sandboxes.test"
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules", "e2b")); err == nil {
		cmd := exec.Command("node", "--input-type=module", "-e", `import { Sandbox } from 'e2b'
const s = await Sandbox.connect(process.env.SBX)
console.log(s.getHost(8765))`)
		cmd.Dir = jsDir
		cmd.Env = append(os.Environ(), "E2B_API_URL="+e.url, "E2B_SANDBOX_URL="+e.url, "E2B_API_KEY="+e.key, "SBX="+c.SandboxID)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != host {
			t.Fatalf("getHost(8765): %v %q, want %q", err, out, host)
		}
	}
	byHost := func(host, path string, hdr map[string]string) reply {
		req, _ := http.NewRequest("GET", e.url+path, nil)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{status: resp.StatusCode, header: resp.Header, body: b}
	}
	token := map[string]string{"E2b-Traffic-Access-Token": c.TrafficAccessToken}
	if r := byHost(host+":443", "/hello.txt", token); r.status != 200 || string(r.body) != "hello from the sandbox" {
		t.Fatalf("GET by host: %d %q", r.status, r.body)
	}
	byHost(host, "/hello.txt", nil).apiErr(t, 403)
	if r := byHost("49983-"+c.SandboxID+".sandboxes.test", "/health", map[string]string{"X-Access-Token": c.EnvdAccessToken}); r.status/100 != 2 {
		t.Fatalf("envd by host: %d %q", r.status, r.body)
	}
	// Hosts of other domains, or not PORT-ID, are not routed.
	for _, h := range []string{"8765-" + c.SandboxID + ".other.test", "x-" + c.SandboxID + ".sandboxes.test", "8765-" + c.SandboxID + ".a.sandboxes.test"} {
		if _, _, ok := e.h.hostRoute(h); ok {
			t.Errorf("host %q routed", h)
		}
	}
	// An upgraded connection (as WebSockets use) is relayed both ways: a
	// server in the sandbox answers 101 and then echoes lines.
	echo := `import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8766)); s.listen(1)
c, _ = s.accept(); f = c.makefile("rwb")
while f.readline() not in (b"\r\n", b""): pass
f.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"); f.flush()
for line in f: f.write(b"echo " + line); f.flush()
`
	if _, err := sb.Agent().WriteFile(ctx, "/workspace/echo.py", strings.NewReader(echo), 0); err != nil {
		t.Fatal(err)
	}
	ep, err := sb.Agent().Exec(ctx, agent.ExecRequest{Argv: []string{"python3", "echo.py"}, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	var conn net.Conn
	var br *bufio.Reader
	for i := 0; i < 200; i++ { // until the echo server listens
		if conn, err = net.Dial("tcp", strings.TrimPrefix(e.url, "http://")); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: 8766\r\nE2b-Traffic-Access-Token: %s\r\n\r\n", c.SandboxID, c.TrafficAccessToken)
		br = bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		resp.Body.Close()
		conn.Close()
		conn = nil
		time.Sleep(50 * time.Millisecond)
	}
	if conn == nil {
		t.Fatal("the upgrade never succeeded")
	}
	defer conn.Close()
	for _, msg := range []string{"one", "two"} {
		fmt.Fprintf(conn, "%s\n", msg)
		line, err := br.ReadString('\n')
		if err != nil || line != "echo "+msg+"\n" {
			t.Fatalf("upgraded connection: %q, %v", line, err)
		}
	}

	delete(hdr, "E2b-Traffic-Access-Token")
	e.do(t, "GET", "/hello.txt", hdr, nil).apiErr(t, 403)
	if _, err := NewHandler(Config{Manager: e.m, Store: e.st, Domain: "https://x.test"}); err == nil {
		t.Error("NewHandler accepted a URL as Domain")
	}
}
