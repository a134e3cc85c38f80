package server_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// raw sends a request with an optional bearer token and returns status,
// error code and body.
func raw(t *testing.T, method, url, token string, body io.Reader) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var code string
	if i := bytes.Index(b, []byte(`"code":"`)); i >= 0 {
		rest := b[i+8:]
		code = string(rest[:bytes.IndexByte(rest, '"')])
	}
	checkDocumented(t, method, url, resp.StatusCode)
	return resp.StatusCode, code, b
}

// TestHostileAPI sends hostile requests to a real server; each must get a
// clear 4xx and change nothing on the host.
func TestHostileAPI(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "alice")
	other := newKey(t, state, "mallory")
	limited := newKey(t, state, "limited", "--max-sandboxes", "1")
	s := startServer(t, state)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	base := s.URL + "/v1/sandboxes/" + sb.ID
	hostPasswd, _ := os.ReadFile("/etc/passwd")
	hostShadow, _ := os.ReadFile("/etc/shadow")

	// Files inside the sandbox that point out of the workspace.
	setup, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "ln -s /etc/passwd pw && ln -s /etc/shadow sh && ln -s / root && ln -s /proc/1/environ env && mkfifo fifo && echo ok"})
	if err != nil || setup.Stdout != "ok\n" {
		t.Fatalf("setup: %+v %v", setup, err)
	}
	// A canary on the host the sandbox must never reach.
	canary := "/tmp/airlock-canary-" + sb.ID
	os.WriteFile(canary, []byte("host secret"), 0o600)
	defer os.Remove(canary)

	cases := []struct {
		name, method, path, token string
		body                      string
		status                    int
	}{
		{"dotdot", "GET", "/files?path=../../etc/passwd", key, "", 400},
		{"dotdot-abs", "GET", "/files?path=/workspace/../etc/shadow", key, "", 400},
		{"absolute outside", "GET", "/files?path=/etc/shadow", key, "", 400},
		{"absolute host canary", "GET", "/files?path=" + canary, key, "", 404},
		{"proc", "GET", "/files?path=/proc/1/environ", key, "", 400},
		{"proc self", "GET", "/files?path=/proc/self/root/etc/passwd", key, "", 400},
		{"nul", "GET", "/files?path=a%00b", key, "", 400},
		{"fifo read", "GET", "/files?path=fifo", key, "", 400},
		{"fifo write", "PUT", "/files?path=fifo", key, "x", 400},
		{"dir read", "GET", "/files?path=/workspace", key, "", 400},
		{"symlink to shadow", "GET", "/files?path=sh", key, "", 404},
		{"write outside", "PUT", "/files?path=/etc/evil", key, "x", 400},
		{"mkdir outside", "POST", "/files/mkdir", key, `{"path":"/usr/evil"}`, 400},
		{"move outside", "POST", "/files/move", key, `{"from":"pw","to":"/etc/x"}`, 400},
		{"remove workspace", "DELETE", "/files?path=/workspace", key, "", 400},
		{"unknown param", "GET", "/files?path=pw&follow=1", key, "", 400},
		{"malformed json", "POST", "/exec", key, `{"argv":["true"`, 400},
		{"not an object", "POST", "/exec", key, `[1,2]`, 400},
		{"trailing data", "POST", "/exec", key, `{"argv":["true"]} {}`, 400},
		{"unknown field", "POST", "/exec", key, `{"argv":["true"],"privileged":true}`, 400},
		{"empty body", "POST", "/exec", key, ``, 400},
		{"argv and shell", "POST", "/exec", key, `{"argv":["true"],"shell":"true"}`, 400},
		{"json too large", "POST", "/exec", key, `{"shell":"` + strings.Repeat("a", 2<<20) + `"}`, 413},
		{"bad pid", "POST", "/processes/abc/signal", key, `{"signal":"KILL"}`, 400},
		{"bad signal", "POST", "/processes/1/signal", key, `{"signal":"NOPE"}`, 400},
		{"another key's sandbox", "GET", "", other, "", 404},
		{"another key exec", "POST", "/exec", other, `{"argv":["true"]}`, 404},
		{"another key delete", "DELETE", "", other, "", 404},
		{"another key file", "GET", "/files?path=pw", other, "", 404},
		{"missing token", "GET", "", "", "", 401},
		{"wrong token", "GET", "", "al_" + strings.Repeat("A", 43), "", 401},
		{"garbage token", "GET", "", "hello", "", 401},
		{"no such sandbox", "GET", "/../sb-0000000000000000", key, "", 404},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			st, code, b := raw(t, tc.method, base+tc.path, tc.token, body)
			if st != tc.status {
				t.Fatalf("%s %s: status %d, want %d: %s", tc.method, tc.path, st, tc.status, b)
			}
			if code == "" {
				t.Fatalf("no JSON error code in %s", b)
			}
			for _, secret := range [][]byte{hostPasswd, hostShadow, []byte("host secret")} {
				if len(secret) > 0 && bytes.Contains(b, secret) {
					t.Fatalf("host file content leaked: %s", b)
				}
			}
		})
	}

	// A symlink to /etc/passwd reads the sandbox's own passwd.
	pw, err := c.ReadFile(ctx, sb.ID, "pw")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(pw, hostPasswd) || !strings.Contains(string(pw), "user:x:1000") {
		t.Fatalf("symlink read gave %q", pw)
	}
	// A symlink to / lists the sandbox's own minimal /etc, not the host's.
	ents, err := c.ListFiles(ctx, sb.ID, "root/etc", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name == "shadow" || e.Name == "gshadow" {
			t.Fatalf("sandbox /etc has the host's %s", e.Name)
		}
	}
	// Body over the file cap: the server was started with the default cap;
	// use a server with a tiny one.
	small := startServer(t, stateDir(t), "--no-auth", "--max-file-bytes", "1024")
	sc := client.New(small.URL, "")
	sb2, err := sc.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.WriteFile(ctx, sb2.ID, "big", bytes.NewReader(make([]byte, 4096)), 0); client.StatusOf(err) != 413 {
		t.Fatalf("oversized upload: %v", err)
	}
	// Streamed without Content-Length.
	pr, pw2 := io.Pipe()
	go func() { pw2.Write(make([]byte, 8192)); pw2.Close() }()
	if _, err := sc.WriteFile(ctx, sb2.ID, "big2", pr, 0); client.StatusOf(err) != 413 {
		t.Fatalf("oversized chunked upload: %v", err)
	}
	if l, _ := sc.ListFiles(ctx, sb2.ID, "/workspace", 1); len(l) != 0 {
		t.Fatalf("oversized uploads left files: %+v", l)
	}

	// Invalid policy and limits.
	if _, err := c.Create(ctx, client.CreateRequest{Profile: "root"}); client.StatusOf(err) != 422 {
		t.Fatalf("bad profile: %v", err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Limits: &client.Limits{MemoryBytes: -1}}); client.StatusOf(err) != 422 {
		t.Fatalf("negative memory: %v", err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Metadata: map[string]string{"bad key!": "x"}}); client.StatusOf(err) != 400 {
		t.Fatalf("bad metadata: %v", err)
	}
	lc := client.New(s.URL, limited)
	if _, err := lc.Create(ctx, client.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := lc.Create(ctx, client.CreateRequest{}); client.StatusOf(err) != 429 {
		t.Fatalf("per-key limit: %v", err)
	}

	// Nothing changed on the host and the sandbox is intact.
	if b, _ := os.ReadFile(canary); string(b) != "host secret" {
		t.Fatal("canary changed")
	}
	if _, err := os.Stat("/etc/evil"); err == nil {
		t.Fatal("/etc/evil created on the host")
	}
	if g, err := c.Get(ctx, sb.ID); err != nil || g.State != "running" {
		t.Fatalf("sandbox after hostile requests: %+v %v", g, err)
	}
	if l, err := client.New(s.URL, other).List(ctx, nil); err != nil || len(l) != 0 {
		t.Fatalf("other key lists %+v %v", l, err)
	}
	_ = fmt.Sprint
}
