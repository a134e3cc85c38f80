package server_test

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestE2ELifecycle drives a real server through the Go client: create,
// write a script, run it, stream it, read what it wrote, a background
// process that outlives its request and is re-attached, and TTL expiry
// checked from the host; once per runtime (the server's
// --default-runtime), gvisor skipped only where runsc is not installed.
func TestE2ELifecycle(t *testing.T) {
	forEachRuntime(t, e2eLifecycle)
}

// forEachRuntime runs test once per runtime as a subtest named after it;
// gvisor is skipped only where runsc is not installed.
func forEachRuntime(t *testing.T, test func(t *testing.T, runtime string)) {
	needRoot(t)
	for _, rt := range []string{"native", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "gvisor" {
				if _, err := gvisor.Available(); err != nil {
					t.Skipf("gvisor tier unavailable: %v", err)
				}
			}
			test(t, rt)
		})
	}
}

func e2eLifecycle(t *testing.T, runtime string) {
	state := stateDir(t)
	key := newKey(t, state, "e2e")
	s := startServer(t, state, "--default-runtime", runtime)
	c := client.New(s.URL, key)
	ctx := ctxT(t)

	info, err := c.Info(ctx)
	if err != nil || info.Version == "" || len(info.Enforced) == 0 || info.DefaultRuntime != runtime || !slices.Contains(info.Runtimes, runtime) {
		t.Fatalf("info: %+v %v", info, err)
	}
	// The contract is served unauthenticated, and matches the routes.
	resp, err := http.Get(s.URL + "/v1/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, p := range []string{"openapi: 3.1.0", "/v1/sandboxes/{id}/exec:", "/v1/sandboxes/{id}/files/list:", "/v1/sandboxes/{id}/processes/{pid}/events:"} {
		if !strings.Contains(string(spec), p) {
			t.Fatalf("openapi.yaml lacks %q", p)
		}
	}
	if resp, err := http.Get(s.URL + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v", err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Metadata: map[string]string{"test": "lifecycle"}, Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != "running" || sb.ExpiresAt == nil || sb.Runtime != runtime {
		t.Fatalf("created: %+v", sb)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Runtime: "kvm"}); client.StatusOf(err) != 422 || !strings.Contains(err.Error(), `unknown "kvm"`) {
		t.Fatalf("create with an unknown runtime: %v", err)
	}
	if runtime == "gvisor" {
		_, err := c.Create(ctx, client.CreateRequest{Image: "alpine"})
		// Image roots are a gvisor capability (issue 26): an image not in
		// the store is the request's fault, not the runtime's.
		if err == nil || strings.Contains(err.Error(), "does not support") || !strings.Contains(err.Error(), "not in the server's image store") {
			t.Fatalf("gvisor create with a missing image: %v", err)
		}
	}
	script := "#!/bin/sh\necho \"hello $1\"\necho oops >&2\necho written > out.txt\nexit 3\n"
	if n, err := c.WriteFile(ctx, sb.ID, "run.sh", strings.NewReader(script), 0o755); err != nil || n != int64(len(script)) {
		t.Fatalf("write: %d %v", n, err)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"./run.sh", "world"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.Stdout != "hello world\n" || res.Stderr != "oops\n" || res.Status != "nonzero_exit" {
		t.Fatalf("exec result: %+v", res)
	}
	out, err := c.ReadFile(ctx, sb.ID, "/workspace/out.txt")
	if err != nil || string(out) != "written\n" {
		t.Fatalf("read out.txt: %q %v", out, err)
	}

	// Streaming.
	st, err := c.ExecStream(ctx, sb.ID, client.ExecRequest{Shell: "for i in 1 2 3; do echo line$i; done; echo err >&2"})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	var stdout strings.Builder
	var exit client.Event
	for {
		ev, err := st.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type)
		if ev.Type == "stdout" {
			stdout.Write(ev.Data)
		}
		if ev.Type == "exit" {
			exit = ev
		}
	}
	st.Close()
	if types[0] != "start" || types[len(types)-1] != "exit" || stdout.String() != "line1\nline2\nline3\n" || exit.ExitCode != 0 {
		t.Fatalf("stream: types %v stdout %q exit %+v", types, stdout.String(), exit)
	}

	// A background process survives its request; re-attach to it.
	pid, err := c.Start(ctx, sb.ID, client.ExecRequest{Shell: "echo started; read line; echo got $line; sleep 600", StdinOpen: true, Tag: "bg"})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := c.Processes(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range procs {
		found = found || (p.Pid == pid && p.Running && p.Tag == "bg")
	}
	if !found {
		t.Fatalf("background pid %d not running in %+v", pid, procs)
	}
	if err := c.WriteStdin(ctx, sb.ID, pid, "ping\n", false); err != nil {
		t.Fatal(err)
	}
	at, err := c.Attach(ctx, sb.ID, pid)
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	for !strings.Contains(got.String(), "got ping") {
		ev, err := at.Next()
		if err != nil {
			t.Fatalf("attach: %v (so far %q)", err, got.String())
		}
		got.Write(ev.Data)
	}
	at.Close()
	if !strings.Contains(got.String(), "started\n") {
		t.Fatalf("attach replay missing buffered output: %q", got.String())
	}
	if err := c.Signal(ctx, sb.ID, pid, "TERM"); err != nil {
		t.Fatal(err)
	}

	// Metrics and listing.
	mt, err := c.Metrics(ctx, sb.ID)
	if err != nil || mt.Pids == 0 || mt.MemoryBytes == 0 || mt.DiskTotalBytes == 0 {
		t.Fatalf("metrics %+v %v", mt, err)
	}
	list, err := c.List(ctx, map[string]string{"test": "lifecycle"})
	if err != nil || len(list) != 1 || list[0].ID != sb.ID {
		t.Fatalf("list: %+v %v", list, err)
	}
	if list, _ := c.List(ctx, map[string]string{"test": "other"}); len(list) != 0 {
		t.Fatalf("metadata filter matched %+v", list)
	}

	// TTL expiry kills the sandbox; check from the host.
	pid1 := initPid(t, state, sb.ID)
	if len(cgroupDirs(sb.ID)) == 0 {
		t.Fatalf("no cgroup dirs for a running sandbox %s", sb.ID)
	}
	if _, err := c.SetTimeout(ctx, sb.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "sandbox expires", func() bool {
		g, err := c.Get(ctx, sb.ID)
		return err == nil && g.State == "expired"
	})
	assertGone(t, state, sb.ID, pid1)
	if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); client.StatusOf(err) != 409 {
		t.Fatalf("exec in an expired sandbox: %v", err)
	}
}
