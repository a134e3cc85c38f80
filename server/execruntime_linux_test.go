package server_test

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/wasm"
)

// TestE2EExecRuntimeDecidedOnce: the exec path decides a sandbox's tier
// once (whether it rewrites argv, and the runtime label of the exec
// metrics) instead of decoding its records on every exec. Repeated execs
// must still be rewritten for a wasm sandbox (and its shell refusal kept),
// run as they are in a native one, and be counted under each one's runtime.
func TestE2EExecRuntimeDecidedOnce(t *testing.T) {
	e := newE2E(t, "execruntime")
	nat := e.sandbox(t, client.CreateRequest{})
	wsb := e.sandbox(t, client.CreateRequest{Runtime: "wasm"})
	if _, err := e.c.WriteFile(e.ctx, wsb.ID, "/workspace/hello.wasm", bytes.NewReader(wasm.HelloModule()), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		res, err := e.c.Exec(e.ctx, nat.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo native"}})
		if err != nil || res.ExitCode != 0 || res.Stdout != "native\n" {
			t.Fatalf("native exec %d: %+v %v", i, res, err)
		}
		res, err = e.c.Exec(e.ctx, wsb.ID, client.ExecRequest{Argv: []string{"hello.wasm"}})
		if err != nil || res.ExitCode != 0 || res.Stdout != wasm.HelloOutput {
			t.Fatalf("wasm exec %d: %+v %v", i, res, err)
		}
		_, err = e.c.Exec(e.ctx, wsb.ID, client.ExecRequest{Shell: "echo native"})
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Message, "WASI modules") {
			t.Fatalf("shell in a wasm sandbox, exec %d: %v", i, err)
		}
	}
	_, _, body := raw(t, "GET", e.s.URL+"/metrics", e.key, nil)
	for _, rt := range []string{"native", "wasm"} {
		re := regexp.MustCompile(`(?m)^airlock_exec_duration_seconds_count\{runtime="` + rt + `",status="ok"\} (\d+)$`)
		m := re.FindSubmatch(body)
		if m == nil || string(m[1]) != "3" {
			t.Fatalf("exec count for runtime %s: %q in\n%s", rt, m, grepLines(body, "airlock_exec_duration_seconds_count"))
		}
	}
}

// grepLines returns the lines of b that contain s.
func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
