package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestRunEarlyPath: a plain `airlock run` runs from package runcli's init,
// before the rest of the binary is initialised, so it never initialises
// the server, the store's SQLite or MCP (GODEBUG=inittrace=1 lists every
// package initialised); a run with a flag that only the full command knows
// takes package main's path, which does initialise them. Both build the
// same sandbox: the same layers enforced, in the same state.
func TestRunEarlyPath(t *testing.T) {
	bin := airlockBin(t)
	type result struct {
		Status   string `json:"status"`
		ExitCode int    `json:"exit_code"`
		Enforced []struct {
			Name  string `json:"name"`
			State string `json:"state"`
		} `json:"enforced"`
	}
	run := func(args ...string) (result, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp", "GODEBUG=inittrace=1"}
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Run(); err != nil {
			t.Fatalf("airlock %v: %v; stderr %q", args, err, e.String())
		}
		var r result
		if err := json.Unmarshal([]byte(o.String()), &r); err != nil {
			t.Fatalf("airlock %v: %v in %q", args, err, o.String())
		}
		if r.Status != "ok" || r.ExitCode != 0 || len(r.Enforced) == 0 {
			t.Fatalf("airlock %v: %+v", args, r)
		}
		return r, e.String()
	}
	early, earlyTrace := run("run", "--json", "--", "/bin/true")
	full, fullTrace := run("run", "--json", "--microvm-accel", "auto", "--", "/bin/true")
	for _, pkg := range []string{"modernc.org/sqlite", "github.com/airlock-dev/airlock/store",
		"github.com/airlock-dev/airlock/server", "github.com/modelcontextprotocol/go-sdk/mcp"} {
		line := "init " + pkg + " @"
		if strings.Contains(earlyTrace, line) {
			t.Errorf("airlock run -- /bin/true initialised %s", pkg)
		}
		if !strings.Contains(fullTrace, line) {
			t.Errorf("the full path did not initialise %s: is it still linked? (the check above means nothing without it)", pkg)
		}
	}
	if len(early.Enforced) != len(full.Enforced) {
		t.Fatalf("early path enforced %+v, full path %+v", early.Enforced, full.Enforced)
	}
	for i := range early.Enforced {
		if early.Enforced[i] != full.Enforced[i] {
			t.Errorf("layer %d: early path %+v, full path %+v", i, early.Enforced[i], full.Enforced[i])
		}
	}
}
