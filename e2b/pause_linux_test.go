package e2b

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestPauseConnectAndAutoPause drives E2B's pause surface against real
// sandboxes: pause (204, then 409), the paused state in getInfo and list,
// traffic refused while paused, connect resuming it (201) with its files,
// the deprecated resume endpoint, and autoPause + autoResume: the end of
// the timeout pauses instead of killing, and traffic resumes it. Both
// runtimes: native pauses with the cgroup freezer, gvisor checkpoints.
func TestPauseConnectAndAutoPause(t *testing.T) {
	for _, rt := range []policy.Runtime{policy.RuntimeNative, policy.RuntimeGVisor} {
		t.Run(string(rt), func(t *testing.T) {
			if rt == policy.RuntimeGVisor {
				if _, err := gvisor.Available(); err != nil {
					t.Skipf("gvisor tier unavailable: %v", err)
				}
			}
			testPauseConnectAndAutoPause(t, newEnvSetup(t, true, envSetup{runtime: rt}))
		})
	}
}

func testPauseConnectAndAutoPause(t *testing.T, e *env) {
	// The label is the manager's, open to airlock's own API: a value other
	// than pause or kill is refused there.
	if _, err := e.m.Create(context.Background(), manager.CreateRequest{Metadata: map[string]string{manager.OnTimeoutKey: "sleep"}}); !errors.Is(err, manager.ErrInvalid) {
		t.Fatalf("create with %s=sleep: %v, want ErrInvalid", manager.OnTimeoutKey, err)
	}
	var created sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base"}`).json(t, &created)
	id := created.SandboxID
	envd := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": e.h.envdToken(id),
		"Content-Type": "application/octet-stream"}
	if r := e.do(t, "POST", "/files?path=/home/user/kept.txt", envd, []byte("before pause")); r.status != 200 {
		t.Fatalf("upload: %d %q", r.status, r.body)
	}
	state := func(id string) string {
		var d sandboxDetail
		e.api(t, "GET", "/sandboxes/"+id, e.key, "").json(t, &d)
		return d.State
	}
	listed := func(q string) []string {
		var ds []sandboxDetail
		e.api(t, "GET", "/v2/sandboxes"+q, e.key, "").json(t, &ds)
		var ids []string
		for _, d := range ds {
			ids = append(ids, d.SandboxID+"="+d.State)
		}
		return ids
	}

	e.api(t, "POST", "/sandboxes/"+id+"/pause", e.other, `{"memory":false}`).apiErr(t, 404)
	e.api(t, "POST", "/sandboxes/"+id+"/resume", e.key, `{}`).apiErr(t, 409)
	e.api(t, "POST", "/sandboxes/"+id+"/pause", e.other, `{}`).apiErr(t, 404)
	if r := e.api(t, "POST", "/sandboxes/"+id+"/pause", e.key, `{}`); r.status != 204 {
		t.Fatalf("pause: %d %q", r.status, r.body)
	}
	e.api(t, "POST", "/sandboxes/"+id+"/pause", e.key, `{}`).apiErr(t, 409)
	if s := state(id); s != "paused" {
		t.Fatalf("getInfo state %q after pause", s)
	}
	if got := listed("?state=paused"); len(got) != 1 || got[0] != id+"=paused" {
		t.Fatalf("state=paused lists %v", got)
	}
	if got := listed("?state=running"); len(got) != 0 {
		t.Fatalf("state=running lists %v", got)
	}
	// No autoResume: traffic finds it not running (E2B's proxy 502).
	if r := e.do(t, "GET", "/files?path=/home/user/kept.txt", envd, nil); r.status != 502 {
		t.Fatalf("read while paused: %d %q", r.status, r.body)
	}
	e.api(t, "POST", "/v2/sandboxes/"+id+"/connect", e.other, `{"memory":false}`).apiErr(t, 404)
	if r := e.api(t, "POST", "/v2/sandboxes/"+id+"/connect", e.key, `{"timeout":60}`); r.status != 201 {
		t.Fatalf("connect to a paused sandbox: %d %q", r.status, r.body)
	}
	if s := state(id); s != "running" {
		t.Fatalf("state %q after connect", s)
	}
	if r := e.do(t, "GET", "/files?path=/home/user/kept.txt", envd, nil); r.status != 200 || string(r.body) != "before pause" {
		t.Fatalf("read after resume: %d %q", r.status, r.body)
	}
	if r := e.api(t, "POST", "/v2/sandboxes/"+id+"/connect", e.key, `{}`); r.status != 200 {
		t.Fatalf("connect to a running sandbox: %d %q", r.status, r.body)
	}
	// The deprecated resume endpoint.
	if r := e.api(t, "POST", "/sandboxes/"+id+"/pause", e.key, ``); r.status != 204 {
		t.Fatalf("pause again: %d %q", r.status, r.body)
	}
	if r := e.api(t, "POST", "/sandboxes/"+id+"/resume", e.key, `{"timeout":60}`); r.status != 201 {
		t.Fatalf("resume: %d %q", r.status, r.body)
	}
	// A paused sandbox can be killed.
	e.api(t, "POST", "/sandboxes/"+id+"/pause", e.key, `{}`)
	if r := e.api(t, "DELETE", "/sandboxes/"+id, e.key, ""); r.status != 204 {
		t.Fatalf("kill a paused sandbox: %d %q", r.status, r.body)
	}
	e.api(t, "GET", "/sandboxes/"+id, e.key, "").apiErr(t, 404)

	// autoPause + autoResume: the timeout's end pauses it, traffic resumes it.
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base","timeout":2,"autoPause":true,"autoResume":{"enabled":true}}`).json(t, &created)
	id = created.SandboxID
	envd["E2b-Sandbox-Id"], envd["X-Access-Token"] = id, e.h.envdToken(id)
	if r := e.do(t, "POST", "/files?path=/home/user/kept.txt", envd, []byte("auto")); r.status != 200 {
		t.Fatalf("upload: %d %q", r.status, r.body)
	}
	var d sandboxDetail
	e.api(t, "GET", "/sandboxes/"+id, e.key, "").json(t, &d)
	if len(d.Metadata) != 0 {
		t.Fatalf("airlock's labels shown in metadata: %v", d.Metadata)
	}
	for deadline := time.Now().Add(60 * time.Second); state(id) != "paused"; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not paused at the end of its timeout: state %q", state(id))
		}
	}
	e.api(t, "GET", "/sandboxes/"+id, e.key, "").json(t, &d)
	if end, err := time.Parse(time.RFC3339Nano, d.EndAt); err != nil || time.Until(end) < time.Hour {
		t.Fatalf("endAt of a sandbox paused at its timeout: %q (%v), want the server's maximum timeout ahead", d.EndAt, err)
	}
	if r := e.do(t, "GET", "/files?path=/home/user/kept.txt", envd, nil); r.status != 200 || string(r.body) != "auto" {
		t.Fatalf("traffic to an autoResume sandbox: %d %q", r.status, r.body)
	}
	if s := state(id); s != "running" {
		t.Fatalf("state %q after traffic resumed it", s)
	}
	e.api(t, "GET", "/sandboxes/"+id, e.key, "").json(t, &d)
	if end, err := time.Parse(time.RFC3339Nano, d.EndAt); err != nil || time.Until(end) > 301*time.Second {
		t.Fatalf("endAt of a sandbox resumed by traffic: %q (%v), want 300 s ahead", d.EndAt, err)
	}
	// Without autoPause the end of the timeout kills it.
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base","timeout":1}`).json(t, &created)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r := e.api(t, "GET", "/sandboxes/"+created.SandboxID, e.key, "")
		if r.status == 404 {
			break
		}
		if time.Now().After(deadline) || strings.Contains(string(r.body), `"paused"`) {
			t.Fatalf("sandbox without autoPause at the end of its timeout: %d %q", r.status, r.body)
		}
	}
}

// TestForkGVisor: E2B's fork of a gvisor sandbox gives count independent
// copies (each starts with the original's file, then keeps its own), with
// the original's metadata; a native sandbox's fork is a 400 naming the
// runtime.
func TestForkGVisor(t *testing.T) {
	if _, err := gvisor.Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	e := newEnvSetup(t, true, envSetup{runtime: policy.RuntimeGVisor})
	var created sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base","metadata":{"k":"v"}}`).json(t, &created)
	files := func(id string) map[string]string {
		return map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": e.h.envdToken(id),
			"Content-Type": "application/octet-stream"}
	}
	put := func(id, body string) {
		t.Helper()
		if r := e.do(t, "POST", "/files?path=/home/user/f.txt", files(id), []byte(body)); r.status != 200 {
			t.Fatalf("upload to %s: %d %q", id, r.status, r.body)
		}
	}
	get := func(id string) string {
		t.Helper()
		r := e.do(t, "GET", "/files?path=/home/user/f.txt", files(id), nil)
		if r.status != 200 {
			t.Fatalf("read in %s: %d %q", id, r.status, r.body)
		}
		return string(r.body)
	}
	put(created.SandboxID, "base")
	e.api(t, "POST", "/sandboxes/"+created.SandboxID+"/fork", e.key, `{"count":11}`).apiErr(t, 400)
	var forks []forkResult
	if r := e.api(t, "POST", "/sandboxes/"+created.SandboxID+"/fork", e.key, `{"count":2,"timeout":60}`); r.status != 200 {
		t.Fatalf("fork: %d %q", r.status, r.body)
	} else {
		r.json(t, &forks)
	}
	ids := []string{created.SandboxID}
	for i, f := range forks {
		if f.Sandbox == nil || f.Error != nil {
			t.Fatalf("fork %d: %+v", i, f.Error)
		}
		ids = append(ids, f.Sandbox.SandboxID)
	}
	if len(ids) != 3 {
		t.Fatalf("forks %+v", forks)
	}
	for i, id := range ids {
		if got := get(id); got != "base" {
			t.Fatalf("sandbox %d before diverging: %q", i, got)
		}
		put(id, fmt.Sprint("own-", i))
	}
	for i, id := range ids {
		if got := get(id); got != fmt.Sprint("own-", i) {
			t.Fatalf("sandbox %d after diverging: %q", i, got)
		}
		var d sandboxDetail
		e.api(t, "GET", "/sandboxes/"+id, e.key, "").json(t, &d)
		if d.Metadata["k"] != "v" || d.TemplateID != "base" {
			t.Fatalf("sandbox %d: metadata %v template %q", i, d.Metadata, d.TemplateID)
		}
	}

	n := newEnv(t, true)
	n.api(t, "POST", "/v2/sandboxes", n.key, `{"templateID":"base"}`).json(t, &created)
	if msg := n.api(t, "POST", "/sandboxes/"+created.SandboxID+"/fork", n.key, `{}`).apiErr(t, 400); !strings.Contains(msg, "gvisor") {
		t.Fatalf("fork of a native sandbox: %q", msg)
	}
}
