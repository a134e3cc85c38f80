package server_test

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// TestE2EInputErrors: bad input is a 4xx that names the problem, never a
// 5xx and never silently accepted; an empty POST body is {}.
func TestE2EInputErrors(t *testing.T) {
	e := newE2E(t, "input")
	s, key := e.s, e.key
	sb, ended := e.sandbox(t, client.CreateRequest{}), e.sandbox(t, client.CreateRequest{})
	if err := e.c.Kill(e.ctx, ended.ID); err != nil {
		t.Fatal(err)
	}
	base := s.URL + "/v1/sandboxes"
	sbu := base + "/" + sb.ID
	long := strings.Repeat("n", 300) // one path component over NAME_MAX (255)
	for _, tc := range []struct {
		method, url, body string
		status            int
		code, msg         string
	}{
		{"POST", base, `null`, 400, "bad_request", "must be a JSON object, not null"},
		{"POST", base, `{"timeout":null}`, 400, "bad_request", `field "timeout" is null`},
		{"POST", base, `{"limits":{"pids":null}}`, 400, "bad_request", `field "limits.pids" is null`},
		{"POST", base, `{"timeout":"600"}`, 400, "bad_request", `field "timeout" must be a number, not string`},
		{"POST", base, `{"timeout":1e9}`, 400, "bad_request", "from 0 to 10000000"},
		{"POST", sbu + "/contexts", `null`, 400, "bad_request", "not null"},
		{"PUT", sbu + "/network", `null`, 400, "bad_request", "not null"},
		{"POST", sbu + "/code", `{}`, 400, "bad_request", "code is required"},
		{"POST", sbu + "/code", `{"language":"bash","code":"echo a\u0000b"}`, 400, "bad_request", "NUL"},
		{"POST", sbu + "/exec", ``, 400, "bad_request", "exactly one of argv and shell"},
		{"GET", base + "?state=bogus", ``, 400, "bad_request", "running, killed, expired, lost, exited"},
		{"POST", sbu + "/processes/4242/stdin", `{"data":"x"}`, 404, "process_not_found", "no process 4242"},
		{"POST", sbu + "/processes/4242/signal", `{"signal":"TERM"}`, 404, "process_not_found", "no process 4242"},
		{"GET", sbu + "/processes/4242/logs", ``, 404, "process_not_found", "no process 4242"},
		{"PUT", sbu + "/files?path=" + long, `x`, 400, "name_too_long", ""},
		{"POST", sbu + "/files/mkdir", `{"path":"` + long + `"}`, 400, "name_too_long", ""},
		{"POST", sbu + "/contexts", `{"language":"bash","cwd":"/workspace/` + long + `"}`, 400, "name_too_long", ""},
	} {
		st, code, body := raw(t, tc.method, tc.url, key, strings.NewReader(tc.body))
		var e struct{ Error struct{ Message string } }
		json.Unmarshal(body, &e)
		if st != tc.status || code != tc.code || !strings.Contains(e.Error.Message, tc.msg) {
			t.Errorf("%s %s %q: %d %s, want %d %s containing %q", tc.method, strings.TrimPrefix(tc.url, s.URL), tc.body, st, body, tc.status, tc.code, tc.msg)
		}
	}
	// An empty body is {}: a sandbox with the defaults.
	if st, _, body := raw(t, "POST", base, key, nil); st != 201 {
		t.Errorf("POST /v1/sandboxes without a body: %d %s", st, body)
	}
	// Killing an ended sandbox answers its state (idempotent).
	for range 2 {
		st, _, body := raw(t, "DELETE", base+"/"+ended.ID, key, nil)
		var got client.Sandbox
		if st != 200 || json.Unmarshal(body, &got) != nil || got.State != "killed" {
			t.Errorf("DELETE of an ended sandbox: %d %s", st, body)
		}
	}
}

// TestE2EProcessLogsAndListing: the logs endpoint returns what a process
// wrote so far without following it; a running process is listed
// without an exit code; the stdin example of docs/api.md works as written.
func TestE2EProcessLogsAndListing(t *testing.T) {
	e := newE2E(t, "logs")
	s, key := e.s, e.key
	sb := e.sandbox(t, client.CreateRequest{})
	sbu := s.URL + "/v1/sandboxes/" + sb.ID
	// docs/api.md's stdin example, as written there.
	execBody, stdinBody := docExample(t, "/exec -d '", `"background":true`), docExample(t, "/stdin -d '", "")
	st, _, body := raw(t, "POST", sbu+"/exec", key, strings.NewReader(execBody))
	var docPid struct{ Pid int }
	if st != 201 || json.Unmarshal(body, &docPid) != nil {
		t.Fatalf("docs/api.md's background exec %s: %d %s", execBody, st, body)
	}
	if st, _, body := raw(t, "POST", sbu+"/processes/"+strconv.Itoa(docPid.Pid)+"/stdin", key, strings.NewReader(stdinBody)); st != 200 {
		t.Fatalf("docs/api.md's stdin example %s: %d %s", stdinBody, st, body)
	}
	eventually(t, 30e9, "the docs example's process reads its stdin", func() bool {
		_, _, body := raw(t, "GET", sbu+"/processes/"+strconv.Itoa(docPid.Pid)+"/logs", key, nil)
		return strings.Contains(string(body), `"stdout":"got hello\n`)
	})

	// A background process reading its stdin, with stderr.
	st, _, body = raw(t, "POST", sbu+"/exec", key, strings.NewReader(`{"shell":"echo ready; read line; echo got:$line; echo err >&2","background":true,"stdin_open":true}`))
	var started struct{ Pid int }
	if st != 201 || json.Unmarshal(body, &started) != nil || started.Pid <= 0 {
		t.Fatalf("background exec: %d %s", st, body)
	}
	pidu := sbu + "/processes/" + strconv.Itoa(started.Pid)
	type logs struct {
		Stdout, Stderr string
		Running        bool
		ExitCode       *int `json:"exit_code"`
	}
	var l logs
	eventually(t, 30e9, "the process's first line in its logs", func() bool {
		st, _, body := raw(t, "GET", pidu+"/logs", key, nil)
		if st != 200 || json.Unmarshal(body, &l) != nil {
			t.Fatalf("logs: %d %s", st, body)
		}
		return l.Stdout == "ready\n"
	})
	if !l.Running || l.ExitCode != nil {
		t.Fatalf("logs of a running process: %+v", l)
	}
	st, _, body = raw(t, "GET", sbu+"/processes", key, nil)
	var list struct{ Processes []map[string]any }
	if st != 200 || json.Unmarshal(body, &list) != nil || len(list.Processes) != 2 {
		t.Fatalf("processes: %d %s", st, body)
	}
	for _, p := range list.Processes {
		if p["running"] != true || p["exit_code"] != nil {
			t.Fatalf("a running process is listed as %v", p)
		}
	}
	if st, _, body := raw(t, "POST", pidu+"/stdin", key, strings.NewReader(stdinBody)); st != 200 {
		t.Fatalf("stdin: %d %s", st, body)
	}
	eventually(t, 30e9, "the process exits", func() bool {
		st, _, body := raw(t, "GET", pidu+"/logs", key, nil)
		l = logs{}
		if st != 200 || json.Unmarshal(body, &l) != nil {
			t.Fatalf("logs: %d %s", st, body)
		}
		return !l.Running
	})
	if l.Stdout != "ready\ngot:hello\n" || l.Stderr != "err\n" || l.ExitCode == nil || *l.ExitCode != 0 {
		t.Fatalf("logs of the exited process: %+v", l)
	}
}

// docExample returns the JSON body (-d '...') of the first curl line of
// docs/api.md that contains marker and also want.
func docExample(t *testing.T, marker, want string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(doc), "\n") {
		i := strings.Index(line, marker)
		if i < 0 || !strings.Contains(line, want) {
			continue
		}
		rest := line[i+len(marker):]
		if j := strings.IndexByte(rest, '\''); j >= 0 {
			// The shell passes the body as written; "\n" stays a JSON escape.
			return rest[:j]
		}
	}
	t.Fatalf("docs/api.md has no curl line with %q and %q", marker, want)
	return ""
}
