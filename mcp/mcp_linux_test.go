package mcp_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/mcp"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/store"
)

func TestListTools(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		if len(tool.Description) < 80 {
			t.Errorf("%s: description too thin for a model: %q", tool.Name, tool.Description)
		}
		b, _ := json.Marshal(tool.InputSchema)
		var sch struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		}
		if err := json.Unmarshal(b, &sch); err != nil || sch.Type != "object" {
			t.Errorf("%s: input schema %s", tool.Name, b)
		}
		switch tool.Name {
		case "run_command", "write_file", "read_file", "list_files":
			if _, ok := sch.Properties["sandbox_id"]; !ok {
				t.Errorf("%s: no sandbox_id in %s", tool.Name, b)
			}
		}
		switch tool.Name {
		case "write_file":
			if !slices.Contains(sch.Required, "path") || !slices.Contains(sch.Required, "content") {
				t.Errorf("write_file: required %v", sch.Required)
			}
		case "create_sandbox":
			if !strings.Contains(string(sch.Properties["network"]), `"none"`) || !strings.Contains(string(sch.Properties["profile"]), `"strict"`) {
				t.Errorf("create_sandbox schema: %s", b)
			}
		case "run_code":
			if !strings.Contains(string(sch.Properties["language"]), `["python","javascript","bash"]`) || !slices.Contains(sch.Required, "code") {
				t.Errorf("run_code schema: %s", b)
			}
			fallthrough
		case "run_command":
			for _, w := range []string{"/workspace", "network", "timeout"} {
				if !strings.Contains(tool.Description, w) {
					t.Errorf("run_command description does not mention %s", w)
				}
			}
		}
	}
	want := []string{"computer", "create_sandbox", "kill_sandbox", "list_files", "list_sandboxes", "read_file", "run_code", "run_command", "write_file"}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
}

func TestRunCommand(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "echo hello; pwd; id -u"}); out != "hello\n/workspace\n1000\n\n" {
		t.Fatalf("got %q", out)
	}
	// State persists in the session's sandbox; stdin, env, cwd, argv.
	mustOK(t, cs, "run_command", map[string]any{"command": "mkdir -p sub && echo kept > sub/f"})
	if out := mustOK(t, cs, "run_command", map[string]any{"argv": []string{"cat", "f"}, "cwd": "sub"}); out != "kept\n\n" {
		t.Fatalf("argv/cwd: %q", out)
	}
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "tr a-z A-Z; echo $GREETING", "stdin": "abc\n", "env": map[string]string{"GREETING": "hi"}}); out != "ABC\nhi\n\n" {
		t.Fatalf("stdin/env: %q", out)
	}
	// Failure: a tool error with stdout, stderr and the exit code.
	out := mustFail(t, cs, "run_command", map[string]any{"command": "echo out; echo oops >&2; exit 3"})
	if !strings.Contains(out, "out\n") || !strings.Contains(out, "stderr:\noops") || !strings.Contains(out, "exit code 3") {
		t.Fatalf("failure: %q", out)
	}
	if out := mustFail(t, cs, "run_command", map[string]any{"argv": []string{"no-such-program"}}); !strings.Contains(out, "exit code 127") {
		t.Fatalf("missing program: %q", out)
	}
	// Bad input is a tool error too, not a protocol error.
	mustFail(t, cs, "run_command", map[string]any{"command": "true", "argv": []string{"true"}})
	mustFail(t, cs, "run_command", map[string]any{})
	mustFail(t, cs, "run_command", map[string]any{"command": "true", "bogus": 1})
	mustFail(t, cs, "run_command", map[string]any{"command": "true", "timeout_seconds": 1e6})
	mustFail(t, cs, "run_command", map[string]any{"command": "true", "sandbox_id": "sb-0000000000000000"})
	// No network: only loopback exists.
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"}); strings.TrimSpace(out) != "lo" {
		t.Fatalf("interfaces: %q", out)
	}
	// One sandbox for the whole session.
	if list, _ := e.m.List(context.Background(), "", manager.ListOptions{}); len(list) != 1 {
		t.Fatalf("%d sandboxes, want 1", len(list))
	}
	// Commands are audited like those of the API.
	mustOK(t, cs, "run_command", map[string]any{"command": "sleep 0.2"})
	events, err := e.st.AuditLog(context.Background(), store.AuditFilter{Action: store.ActionExec + ".result", Limit: 1})
	if err != nil || len(events) != 1 {
		t.Fatalf("audit: %v %v", events, err)
	}
	var detail struct {
		Via        string   `json:"via"`
		Argv       []string `json:"argv"`
		Status     string   `json:"status"`
		DurationMS int64    `json:"duration_ms"`
	}
	json.Unmarshal(events[0].Detail, &detail)
	if detail.Via != "mcp" || !slices.Equal(detail.Argv, []string{"/bin/sh", "-c", "sleep 0.2"}) || detail.Status != "ok" || detail.DurationMS < 200 {
		t.Fatalf("audit event: %s", events[0].Detail)
	}
}

func TestConcurrentFirstCalls(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mustOK(t, cs, "run_command", map[string]any{"command": "hostname"})
		}()
	}
	wg.Wait()
	if list, _ := e.m.List(context.Background(), "", manager.ListOptions{}); len(list) != 1 {
		t.Fatalf("%d sandboxes after concurrent first calls, want 1", len(list))
	}
}

func TestFiles(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	if out := mustOK(t, cs, "write_file", map[string]any{"path": "dir/hello.py", "content": "print('hi')\n"}); !strings.Contains(out, "wrote 12 bytes to /workspace/dir/hello.py") {
		t.Fatalf("write: %q", out)
	}
	if out := mustOK(t, cs, "read_file", map[string]any{"path": "/workspace/dir/hello.py"}); out != "print('hi')\n\n" {
		t.Fatalf("read: %q", out)
	}
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "python3 dir/hello.py"}); out != "hi\n\n" {
		t.Fatalf("run the written file: %q", out)
	}
	mustOK(t, cs, "run_command", map[string]any{"command": "echo x > top.txt; ln -s top.txt link"})
	out := mustOK(t, cs, "list_files", nil)
	for _, w := range []string{"d          - dir/", "f          2 top.txt", "l          - link -> top.txt"} {
		if !strings.Contains(out, w) {
			t.Fatalf("list_files lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "hello.py") {
		t.Fatalf("depth 1 listed a nested file:\n%s", out)
	}
	if out := mustOK(t, cs, "list_files", map[string]any{"path": "/workspace", "depth": 2}); !strings.Contains(out, "f         12 dir/hello.py") {
		t.Fatalf("depth 2:\n%s", out)
	}
	// Binary data as base64; an image comes back as image content.
	img := image.NewRGBA(image.Rect(0, 0, 40, 30))
	for x := 0; x < 40; x++ {
		img.Set(x, x%30, color.RGBA{R: 255, A: 255})
	}
	var buf bytes.Buffer
	png.Encode(&buf, img)
	mustOK(t, cs, "write_file", map[string]any{"path": "plot.png", "content": base64.StdEncoding.EncodeToString(buf.Bytes()), "encoding": "base64"})
	r := call(t, cs, "read_file", map[string]any{"path": "plot.png"})
	if r.IsError || len(r.Content) != 1 {
		t.Fatalf("read png: %+v", r)
	}
	ic, ok := r.Content[0].(*sdk.ImageContent)
	if !ok || ic.MIMEType != "image/png" {
		t.Fatalf("read png: %T %+v", r.Content[0], r.Content[0])
	}
	got, err := png.Decode(bytes.NewReader(ic.Data))
	if err != nil || got.Bounds().Dx() != 40 || got.Bounds().Dy() != 30 {
		t.Fatalf("decoded png: %v %v", err, got)
	}
	// Other binary files are described, not dumped.
	mustOK(t, cs, "write_file", map[string]any{"path": "blob", "content": base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 0xff, 0xfe}), "encoding": "base64"})
	if out := mustOK(t, cs, "read_file", map[string]any{"path": "blob"}); !strings.Contains(out, "binary file (5 bytes") {
		t.Fatalf("binary: %q", out)
	}
	// Long text is truncated with a note.
	mustOK(t, cs, "run_command", map[string]any{"command": "seq 1 100000 > big.txt"})
	if out := mustOK(t, cs, "read_file", map[string]any{"path": "big.txt"}); !strings.HasPrefix(out, "1\n2\n3\n") || !strings.Contains(out, "truncated: showing the first 128.0 KiB of 575.1 KiB") {
		t.Fatalf("big file: %q...", out[len(out)-300:])
	}
	mustOK(t, cs, "run_command", map[string]any{"command": "ln -s big.txt biglink"})
	if out := mustOK(t, cs, "read_file", map[string]any{"path": "biglink"}); !strings.Contains(out, "showing the first 128.0 KiB of 575.1 KiB") {
		t.Fatalf("through a symlink: %q...", out[len(out)-300:])
	}
	// Failures are tool errors.
	for _, p := range []string{"nope.txt", "/etc/shadow", "dir"} {
		mustFail(t, cs, "read_file", map[string]any{"path": p})
	}
	if out := mustFail(t, cs, "write_file", map[string]any{"path": "/usr/evil", "content": "x"}); !strings.Contains(out, "denied") && !strings.Contains(out, "read-only") {
		t.Fatalf("write outside: %q", out)
	}
	mustFail(t, cs, "write_file", map[string]any{"path": "x", "content": "!!", "encoding": "base64"})
	mustFail(t, cs, "list_files", map[string]any{"path": "/nonexistent"})
}

func TestOutputTruncated(t *testing.T) {
	e := newEnv(t, func(c *mcp.Config) { c.MaxOutput = 1000 })
	cs := e.connect(t)
	out := mustOK(t, cs, "run_command", map[string]any{"command": "seq 1 100000; seq 1 10 >&2"})
	if !strings.HasPrefix(out, "1\n2\n3\n") || !strings.Contains(out, "99999\n100000\n") {
		t.Fatalf("head and tail not kept: %q", out)
	}
	if !regexp.MustCompile(`\[\.\.\. 574\.\d KiB of stdout cut here: it was 575\.\d KiB in total`).MatchString(out) {
		t.Fatalf("no truncation note: %q", out)
	}
	if len(out) > 1500 {
		t.Fatalf("%d bytes returned, want about 1000", len(out))
	}
	if !strings.Contains(out, "stderr:\n1\n2\n") {
		t.Fatalf("stderr: %q", out)
	}
}

// TestHostile: a fork bomb, a memory bomb and reading host secrets fail as
// tool errors inside the sandbox, and the next call works.
func TestHostile(t *testing.T) {
	e := newEnv(t, func(c *mcp.Config) { c.Limits.Pids = 64 })
	cs := e.connect(t)
	bombs := []map[string]any{
		{"command": "bash -c ':(){ :|:& };:'"},
		{"command": "f(){ f|f& };f"},
		{"argv": []string{"python3", "-c", "import os\nwhile True:\n  try: os.fork()\n  except OSError: pass"}, "timeout_seconds": 2},
	}
	for i, args := range bombs {
		start := time.Now()
		var out string
		if i < 2 {
			// A shell bomb's first shell exits 0 at once; its copies either
			// burn out against the pids limit before the call returns (a
			// result whose stderr shows the refused forks) or are killed
			// with the command's process group (a tool error). Either way
			// the limit held, and the next call must work.
			r := call(t, cs, "run_command", args)
			out = text(r)
			if !r.IsError && !strings.Contains(out, "Cannot fork") && !strings.Contains(out, "Resource temporarily unavailable") {
				t.Fatalf("%v: neither a tool error nor refused forks: %q", args, out)
			}
		} else {
			out = mustFail(t, cs, "run_command", args)
		}
		t.Logf("%v -> %q in %s", args, out, time.Since(start))
		if out := mustOK(t, cs, "run_command", map[string]any{"command": "echo alive"}); out != "alive\n\n" {
			t.Fatalf("after %v: %q", args, out)
		}
	}
	out := mustFail(t, cs, "run_command", map[string]any{"argv": []string{"python3", "-c", "x = bytearray(8 << 30)"}})
	if !strings.Contains(out, "MemoryError") && !strings.Contains(out, "killed") {
		t.Fatalf("memory bomb: %q", out)
	}
	if out := mustFail(t, cs, "run_command", map[string]any{"command": "cat /etc/shadow"}); !strings.Contains(out, "No such file") {
		t.Fatalf("shadow: %q", out)
	}
	mustFail(t, cs, "read_file", map[string]any{"path": "/etc/shadow"})
	mustOK(t, cs, "run_command", map[string]any{"command": "echo still alive"})
	// A call that outlives its timeout is stopped with its children.
	start := time.Now()
	out = mustFail(t, cs, "run_command", map[string]any{"command": "sleep 60 & sleep 60", "timeout_seconds": 0.5})
	if !strings.Contains(out, "timed out after 500ms") || time.Since(start) > 10*time.Second {
		t.Fatalf("timeout: %q after %s", out, time.Since(start))
	}
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "ps -e -o comm= | grep -c sleep || true"}); strings.TrimSpace(out) != "0" {
		t.Fatalf("sleeps survived the timeout: %q", out)
	}
	if list, _ := e.m.List(context.Background(), "", manager.ListOptions{}); len(list) != 1 {
		t.Fatalf("%d sandboxes, want the session's one", len(list))
	}
}

// TestSessionEndKillsDefaultSandbox: the session's sandbox is gone from
// the manager and the host once the client disconnects; a sandbox made
// with create_sandbox is not.
func TestSessionEndKillsDefaultSandbox(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	mustOK(t, cs, "run_command", map[string]any{"command": "echo started"})
	own := ownSandbox(t, cs)
	out := mustOK(t, cs, "create_sandbox", map[string]any{"label": "keep"})
	extra := regexp.MustCompile(`created sandbox (sb-[0-9a-f]+)`).FindStringSubmatch(out)
	if extra == nil {
		t.Fatalf("create_sandbox: %q", out)
	}
	cs.Close()
	rec := waitGone(t, e.st, own)
	if rec.State != "killed" {
		t.Fatalf("own sandbox ended as %s (%s)", rec.State, rec.EndReason)
	}
	if _, err := e.m.Lookup("", extra[1]); err != nil {
		t.Fatalf("created sandbox died with the session: %v", err)
	}
	if list, _ := e.m.List(context.Background(), "", manager.ListOptions{}); len(list) != 1 || list[0].ID != extra[1] {
		t.Fatalf("running after the session: %+v", list)
	}
}

func TestCreateListKill(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.connect(t)
	out := mustOK(t, cs, "create_sandbox", map[string]any{"profile": "standard", "memory_mb": 256, "timeout_seconds": 600, "label": "data", "env": map[string]string{"MODE": "x"}})
	m := regexp.MustCompile(`created sandbox (sb-[0-9a-f]+) \(profile standard, no network; it is destroyed at `).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("create: %q", out)
	}
	id := m[1]
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "echo $MODE > f; cat f", "sandbox_id": id}); out != "x\n\n" {
		t.Fatalf("run in created: %q", out)
	}
	// Separate from the session's own sandbox.
	mustFail(t, cs, "read_file", map[string]any{"path": "f"})
	if out := mustOK(t, cs, "read_file", map[string]any{"path": "f", "sandbox_id": id}); out != "x\n\n" {
		t.Fatalf("read in created: %q", out)
	}
	own := ownSandbox(t, cs)
	list := mustOK(t, cs, "list_sandboxes", nil)
	if !strings.Contains(list, "2 running sandboxes") || !strings.Contains(list, id+"  profile standard") || !strings.Contains(list, `label "data"`) {
		t.Fatalf("list: %q", list)
	}
	mustFail(t, cs, "create_sandbox", map[string]any{"network": "open"})
	mustFail(t, cs, "create_sandbox", map[string]any{"profile": "root"})
	if out := mustOK(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id}); !strings.Contains(out, "destroyed sandbox "+id) {
		t.Fatalf("kill: %q", out)
	}
	waitGone(t, e.st, id)
	if out := mustFail(t, cs, "run_command", map[string]any{"command": "true", "sandbox_id": id}); !strings.Contains(out, "has ended") {
		t.Fatalf("use killed: %q", out)
	}
	mustFail(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id})
	// Without an id, kill_sandbox destroys the session's own sandbox; the
	// next call starts a fresh one.
	mustOK(t, cs, "kill_sandbox", nil)
	waitGone(t, e.st, own)
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "ls"}); out != "(no output, exit code 0)\n" {
		t.Fatalf("fresh sandbox: %q", out)
	}
	if ownSandbox(t, cs) == own {
		t.Fatal("same sandbox after kill")
	}
}

// TestDefaultSandboxExpiry: a session's sandbox that expired while idle is
// replaced, and the model is told that its state is gone.
func TestDefaultSandboxExpiry(t *testing.T) {
	e := newEnv(t, func(c *mcp.Config) { c.SandboxTimeout = 4 * time.Second })
	cs := e.connect(t)
	mustOK(t, cs, "write_file", map[string]any{"path": "a", "content": "1"})
	own := ownSandbox(t, cs)
	// Use keeps it alive past its first expiry.
	for i := 0; i < 6; i++ {
		time.Sleep(time.Second)
		mustOK(t, cs, "read_file", map[string]any{"path": "a"})
	}
	waitGone(t, e.st, own)
	out := mustFail(t, cs, "read_file", map[string]any{"path": "a"})
	if !strings.Contains(out, "previous sandbox "+own+" ended (timeout expired)") {
		t.Fatalf("after expiry: %q", out)
	}
}

// TestSandboxLimit: hitting the server's sandbox limit is a tool error.
func TestSandboxLimit(t *testing.T) {
	e := newEnvMax(t, 3, nil)
	cs := e.connect(t)
	for i := 0; i < 2; i++ {
		mustOK(t, cs, "create_sandbox", nil)
	}
	mustOK(t, cs, "run_command", map[string]any{"command": "true"})
	if out := mustFail(t, cs, "create_sandbox", nil); !strings.Contains(out, "sandbox limit reached") {
		t.Fatalf("over the limit: %q", out)
	}
}

// TestNetwork: the sandboxes get the configured egress policy;
// create_sandbox can turn it off or narrow it, never widen it.
func TestNetwork(t *testing.T) {
	var hits atomic.Int32
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "hello %s, key %q\n", r.Host, r.Header.Get("X-Api-Key"))
	}))
	defer web.Close()
	port := web.URL[strings.LastIndexByte(web.URL, ':')+1:]
	resolver := egress.StaticResolver{"allowed.test": {net.IPv4(127, 0, 0, 1)}, "other.test": {net.IPv4(127, 0, 0, 1)}}
	e := newEnvNet(t, manager.EgressConfig{Resolver: resolver}, func(c *mcp.Config) {
		c.Network = policy.Network{Mode: policy.NetAllowlist, Allow: []string{"allowed.test", "127.0.0.1"}}
		c.Secrets = []egress.Secret{{Host: "allowed.test", Header: "X-Api-Key", Value: "s3cret"}}
	})
	cs := e.connect(t)
	res, _ := cs.ListTools(context.Background(), nil)
	for _, tool := range res.Tools {
		if tool.Name == "run_command" && !strings.Contains(tool.Description, "only these destinations are reachable") {
			t.Fatalf("run_command does not describe the network: %s", tool.Description)
		}
	}
	curl := func(host string) map[string]any {
		return map[string]any{"command": "curl -fsS -m 10 --noproxy '' http://" + host + ":" + port + "/", "timeout_seconds": 20}
	}
	if out := mustOK(t, cs, "run_command", curl("allowed.test")); !strings.Contains(out, `hello allowed.test:`+port+`, key "s3cret"`) {
		t.Fatalf("allowed: %q", out)
	}
	if out := mustOK(t, cs, "run_command", map[string]any{"command": "env | grep -c s3cret || true"}); strings.TrimSpace(out) != "0" {
		t.Fatalf("the secret is visible inside: %q", out)
	}
	if out := mustFail(t, cs, "run_command", curl("other.test")); !strings.Contains(out, "403") {
		t.Fatalf("other: %q", out)
	}
	// Narrowed to the address only.
	out := mustOK(t, cs, "create_sandbox", map[string]any{"allow": []string{"127.0.0.1"}})
	id := regexp.MustCompile(`sb-[0-9a-f]+`).FindString(out)
	if !strings.Contains(out, "network limited to 127.0.0.1") {
		t.Fatalf("create: %q", out)
	}
	mustFail(t, cs, "run_command", map[string]any{"command": curl("allowed.test")["command"], "sandbox_id": id})
	if out := mustOK(t, cs, "run_command", map[string]any{"command": curl("127.0.0.1")["command"], "sandbox_id": id}); !strings.Contains(out, "hello 127.0.0.1") {
		t.Fatalf("narrowed: %q", out)
	}
	// Off.
	out = mustOK(t, cs, "create_sandbox", map[string]any{"network": "none"})
	id = regexp.MustCompile(`sb-[0-9a-f]+`).FindString(out)
	mustFail(t, cs, "run_command", map[string]any{"command": curl("allowed.test")["command"], "sandbox_id": id})
	// Never wider.
	for _, args := range []map[string]any{
		{"allow": []string{"evil.test"}},
		{"allow": []string{"*.test"}},
		{"network": "open"},
		{"network": "none", "allow": []string{"allowed.test"}},
	} {
		mustFail(t, cs, "create_sandbox", args)
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("%d requests reached the web server, want 2", n)
	}
}
