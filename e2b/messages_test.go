package e2b

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/agent"
)

func TestProtoJSONDecoding(t *testing.T) {
	var sel struct {
		A processSelector `json:"a"`
		B processSelector `json:"b"`
	}
	if err := json.Unmarshal([]byte(`{"a":{"pid":42},"b":{"pid":"43"}}`), &sel); err != nil {
		t.Fatal(err)
	}
	if *sel.A.Pid != 42 || *sel.B.Pid != 43 {
		t.Fatalf("pids %d %d", *sel.A.Pid, *sel.B.Pid)
	}
	for _, bad := range []string{`{"pid":-1}`, `{"pid":4294967296}`, `{"pid":1.5}`, `{"pid":"x"}`, `{"pid":true}`} {
		var s processSelector
		if err := json.Unmarshal([]byte(bad), &s); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	var exp processSelector
	if err := json.Unmarshal([]byte(`{"pid":1e3}`), &exp); err != nil || *exp.Pid != 1000 {
		t.Errorf("exponent form: %v", err)
	}

	for _, enc := range []string{`"aGk/Pz4+"`, `"aGk_Pz4-"`} {
		var in processInput
		if err := json.Unmarshal([]byte(`{"stdin":`+enc+`}`), &in); err != nil || string(*in.Stdin) != "hi??>>" {
			t.Errorf("bytes %s: %q %v", enc, *in.Stdin, err)
		}
	}
	var padded processInput
	if err := json.Unmarshal([]byte(`{"stdin":"aGk="}`), &padded); err != nil || string(*padded.Stdin) != "hi" {
		t.Errorf("padded base64: %v", err)
	}
	var badb processInput
	if err := json.Unmarshal([]byte(`{"stdin":"!!!"}`), &badb); err == nil {
		t.Error("bad base64 accepted")
	}

	for in, want := range map[string]int32{`"SIGNAL_SIGKILL"`: 9, `15`: 15, `"SIGNAL_SIGTERM"`: 15, `null`: 0} {
		var r sendSignalRequest
		if err := json.Unmarshal([]byte(`{"signal":`+in+`}`), &r); err != nil || int32(r.Signal) != want {
			t.Errorf("signal %s: %d %v", in, r.Signal, err)
		}
	}
	var r sendSignalRequest
	if err := json.Unmarshal([]byte(`{"signal":"SIGSTOP"}`), &r); err == nil {
		t.Error("unknown enum name accepted")
	}

	for _, in := range []string{
		`{"path":"/p","recursive":true,"includeEntry":true,"allowNetworkMounts":true}`,
		`{"path":"/p","recursive":true,"include_entry":true,"allow_network_mounts":true}`,
	} {
		var w watchRequest
		if err := json.Unmarshal([]byte(in), &w); err != nil || w != (watchRequest{"/p", true, true, true}) {
			t.Errorf("%s: %+v %v", in, w, err)
		}
	}
	var wid watcherIDRequest
	if err := json.Unmarshal([]byte(`{"watcher_id":"abc"}`), &wid); err != nil || wid.WatcherID != "abc" {
		t.Errorf("watcher_id: %+v %v", wid, err)
	}
}

func TestProtoJSONEncoding(t *testing.T) {
	ts := time.Date(2024, 5, 6, 7, 8, 9, 120_000_000, time.FixedZone("x", 3600))
	pt := pbTime(ts)
	e := entryInfo{Name: "a", Type: pbFileType(fileTypeDirectory), Path: "/home/user/a", Size: 1 << 40, Mode: 0o755,
		Permissions: "drwxr-xr-x", ModifiedTime: &pt}
	b, _ := json.Marshal(e)
	want := `{"name":"a","type":"FILE_TYPE_DIRECTORY","path":"/home/user/a","size":"1099511627776","mode":493,"permissions":"drwxr-xr-x","modifiedTime":"2024-05-06T06:08:09.120Z"}`
	if string(b) != want {
		t.Fatalf("entry\n got %s\nwant %s", b, want)
	}
	for ns, want := range map[int]string{0: `"2024-05-06T06:08:09Z"`, 1000: `"2024-05-06T06:08:09.000001Z"`, 1: `"2024-05-06T06:08:09.000000001Z"`} {
		b, _ := json.Marshal(pbTime(time.Date(2024, 5, 6, 6, 8, 9, ns, time.UTC)))
		if string(b) != want {
			t.Errorf("%d ns: %s, want %s", ns, b, want)
		}
	}
	ev := eventResponse{Event: &processEvent{Data: &dataEvent{Stdout: []byte("hi\n")}}}
	if b, _ := json.Marshal(ev); string(b) != `{"event":{"data":{"stdout":"aGkK"}}}` {
		t.Errorf("data event %s", b)
	}
	ka := eventResponse{Event: &processEvent{Keepalive: &empty{}}}
	if b, _ := json.Marshal(ka); string(b) != `{"event":{"keepalive":{}}}` {
		t.Errorf("keepalive %s", b)
	}
	st := eventResponse{Event: &processEvent{Start: &startEvent{Pid: 7}}}
	if b, _ := json.Marshal(st); string(b) != `{"event":{"start":{"pid":7}}}` {
		t.Errorf("start %s", b)
	}
}

func TestEndFor(t *testing.T) {
	str := func(e *endEvent) string { b, _ := json.Marshal(e); return string(b) }
	for _, tc := range []struct {
		st   agent.ExitStatus
		want string
	}{
		{agent.ExitStatus{Code: 0}, `{"exited":true,"status":"exit status 0"}`},
		{agent.ExitStatus{Code: 3}, `{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}`},
		{agent.ExitStatus{Code: 137, Signal: "SIGKILL"}, `{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}`},
		{agent.ExitStatus{Code: 143, Signal: "SIGTERM"}, `{"exitCode":-1,"status":"signal: terminated","error":"signal: terminated"}`},
		{agent.ExitStatus{Code: 200, Signal: "SIGRTMIN"}, `{"exitCode":-1,"status":"signal: SIGRTMIN","error":"signal: SIGRTMIN"}`},
	} {
		if got := str(endFor(tc.st)); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.st, got, tc.want)
		}
	}
}

func TestEntryFor(t *testing.T) {
	mt := time.Unix(1700000000, 0)
	for _, tc := range []struct {
		fi   agent.FileInfo
		typ  int32
		perm string
		path string
	}{
		{agent.FileInfo{Name: "f", Path: "/workspace/f", Type: agent.TypeFile, Size: 3, Mode: 0o644, ModTime: mt}, fileTypeFile, "-rw-r--r--", "/home/user/f"},
		{agent.FileInfo{Name: "d", Path: "/workspace/d", Type: agent.TypeDir, Mode: 0o755 | os.ModeSticky}, fileTypeDirectory, "dtrwxr-xr-x", "/home/user/d"},
		{agent.FileInfo{Name: "l", Path: "/tmp/l", Type: agent.TypeSymlink, Mode: 0o777, Target: "/workspace/f"}, fileTypeSymlink, "Lrwxrwxrwx", "/tmp/l"},
		{agent.FileInfo{Name: "p", Path: "/tmp/p", Type: agent.TypeOther, Mode: 0o600}, fileTypeUnspecified, "?rw-------", "/tmp/p"},
	} {
		e := entryFor(tc.fi)
		if int32(e.Type) != tc.typ || e.Permissions != tc.perm || e.Path != tc.path || e.Mode != uint32(tc.fi.Mode.Perm()) {
			t.Errorf("%s: %+v", tc.fi.Name, e)
		}
		if tc.fi.Type == agent.TypeSymlink && (e.SymlinkTarget == nil || *e.SymlinkTarget != "/home/user/f") {
			t.Errorf("symlink target %v", e.SymlinkTarget)
		}
	}
}

func TestPaths(t *testing.T) {
	for in, want := range map[string]string{
		"":                      "/workspace",
		"~":                     "/workspace",
		"~/a":                   "/workspace/a",
		"a/b":                   "/workspace/a/b",
		"./a/../b":              "/workspace/b",
		"/home/user":            "/workspace",
		"/home/user/":           "/workspace",
		"/home/user/x/y":        "/workspace/x/y",
		"/home/userx":           "/home/userx",
		"/home/user/../../etc":  "/etc",
		"/tmp/../home/user/a":   "/workspace/a",
		"/workspace/a":          "/workspace/a",
		"../../etc/passwd":      "/etc/passwd",
		"/home/user/a//b/./c/.": "/workspace/a/b/c",
	} {
		got, ok := toSandbox(in)
		if !ok || got != want {
			t.Errorf("toSandbox(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
	for _, bad := range []string{"a\x00b", "\xff", strings.Repeat("a", maxPathLen+1)} {
		if _, ok := toSandbox(bad); ok {
			t.Errorf("toSandbox(%q) accepted", bad)
		}
	}
	for in, want := range map[string]string{"/workspace": "/home/user", "/workspace/a": "/home/user/a",
		"/workspaces": "/workspaces", "/tmp/x": "/tmp/x", "/": "/"} {
		if got := fromSandbox(in); got != want {
			t.Errorf("fromSandbox(%q) = %q, want %q", in, got, want)
		}
	}
	for _, ok := range []string{"a", "/home/user/a", "/tmp", "/tmp/x", "/workspace/z"} {
		if _, err := fileTarget(ok); err != nil {
			t.Errorf("fileTarget(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "/", "/etc/passwd", "../../etc/passwd", "/home/user/../../proc/1/environ", "/tmpx", "/home"} {
		if p, err := fileTarget(bad); err == nil {
			t.Errorf("fileTarget(%q) = %q, want an error", bad, p)
		}
	}
}

func TestNetworkFor(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		allow *bool
		raw   string
		want  string // mode allow deny, or "error"
		nsec  int
	}{
		{nil, ``, "none [] []", 0},
		{&no, ``, "none [] []", 0},
		{&yes, ``, "open [] []", 0},
		{nil, `{"denyOut":["10.0.0.0/8"]}`, "open [] [10.0.0.0/8]", 0},
		{nil, `{"allowOut":["pypi.org"]}`, "open [] []", 0},
		{nil, `{"denyOut":["0.0.0.0/0"],"allowOut":["pypi.org","1.2.3.4"]}`, "allowlist [pypi.org 1.2.3.4] []", 0},
		{nil, `{"denyOut":["0.0.0.0/0","10.0.0.0/8"],"allowOut":["pypi.org"]}`, "allowlist [pypi.org] []", 0},
		{&no, `{"allowOut":["pypi.org"]}`, "allowlist [pypi.org] []", 0},
		{&no, `{"denyOut":["1.1.1.1"]}`, "none [] []", 0},
		{nil, `{"denyOut":["0.0.0.0/0"]}`, "none [] []", 0},
		{nil, `{"allowOut":["a.com"],"denyOut":["1.1.1.1"]}`, "error", 0},
		{nil, `{"egressProxy":{"address":"p:1"}}`, "error", 0},
		{nil, `{"maskRequestHost":"x"}`, "error", 0},
		{nil, `{"allowOut":5}`, "error", 0},
		{&yes, `{"rules":{"api.example.com":[{"transform":{"headers":{"Authorization":"Bearer s","X-B":"c"}}}],"*.x.org":[{}]}}`, "open [] []", 2},
		{nil, `{"allowPublicTraffic":false}`, "none [] []", 0},
		{nil, `{"rules":{"a.com":[{"transform":{"headers":{"A":"b"}}}]}}`, "none [] []", 1},
	} {
		n, secrets, err := networkFor(tc.allow, json.RawMessage(tc.raw), false)
		got := "error"
		if err == nil {
			got = fmt.Sprintf("%s %v %v", n.Mode, n.Allow, n.Deny)
		}
		if got != tc.want || len(secrets) != tc.nsec {
			t.Errorf("%v %s: %s (%d secrets), want %s (%d)", tc.allow, tc.raw, got, len(secrets), tc.want, tc.nsec)
		}
	}
}

func TestNetworkForReplace(t *testing.T) {
	n, _, err := networkFor(nil, json.RawMessage(`{}`), true)
	if err != nil || n.Mode != "open" {
		t.Fatalf("an empty update clears the rules (internet, as on E2B): %+v %v", n, err)
	}
}
