package e2b

import (
	"os"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/internal/testserver"
)

// TestFullDiskFailsClosed: with the state directory's file system full,
// E2B process starts, code cells, uploads and removes are refused, naming the full
// directory, and do not happen.
func TestFullDiskFailsClosed(t *testing.T) {
	var state string
	e := newEnvSetup(t, true, envSetup{Config: Config{Interpreter: AgentInterpreter{}}, prepare: func(t *testing.T, dir string) {
		testserver.MountTmpfs(t, dir, "24m")
		state = dir
	}})
	var created sandboxCreated
	r := e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"code-interpreter-v1"}`)
	if r.status != 201 {
		t.Fatalf("create: %d %q", r.status, r.body)
	}
	r.json(t, &created)
	id := created.SandboxID
	envd := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": e.h.envdToken(id)}
	up := map[string]string{"Content-Type": "application/octet-stream"}
	for k, v := range envd {
		up[k] = v
	}
	if r := e.do(t, "POST", "/files?path=/home/user/keep.txt", up, []byte("k")); r.status != 200 {
		t.Fatalf("upload before the disk fills: %d %q", r.status, r.body)
	}
	filler := testserver.FillDisk(t, state)
	full := "no space left on device: " + state

	_, err := e.stream(t, id, "process.Process/Start", `{"process":{"cmd":"/bin/touch","args":["/home/user/ran"]}}`, nil)
	if err == nil || err.Code != CodeUnavailable || !strings.Contains(err.Message, full) {
		t.Fatalf("process start on a full disk: %+v", err)
	}
	if msg := e.do(t, "POST", "/files?path=/home/user/up.txt", up, []byte("x")).apiErr(t, 507); !strings.Contains(msg, full) {
		t.Fatalf("upload on a full disk: %q", msg)
	}
	interp := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49999",
		"E2b-Traffic-Access-Token": created.TrafficAccessToken, "Content-Type": "application/json"}
	if r := e.do(t, "POST", "/execute", interp, []byte(`{"code":"open('/home/user/ran-code', 'w')"}`)); r.status != 507 || !strings.Contains(string(r.body), full) {
		t.Fatalf("code cell on a full disk: %d %s", r.status, r.body)
	}
	r = e.rpc(t, id, "filesystem.Filesystem/Remove", `{"path":"/home/user/keep.txt"}`, nil)
	r.rpcErr(t, CodeUnavailable)
	if !strings.Contains(string(r.body), full) {
		t.Fatalf("remove on a full disk: %s", r.body)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]Code{"/home/user/ran": CodeNotFound, "/home/user/up.txt": CodeNotFound, "/home/user/ran-code": CodeNotFound} {
		e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"`+path+`"}`, nil).rpcErr(t, want)
	}
	if r := e.rpc(t, id, "filesystem.Filesystem/Stat", `{"path":"/home/user/keep.txt"}`, nil); r.status != 200 {
		t.Fatalf("the refused remove happened: %d %s", r.status, r.body)
	}
}
