package approval

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/policy"
)

func TestParseRefuses(t *testing.T) {
	for _, bad := range []string{
		`{"require":[{"action":"exec","argv":"("}]}`,
		`{"require":[{"action":"launch"}]}`,
		`{"require":[{"action":"exec","tool":"x"}]}`,
		`{"require":[{"action":"mcp_tool"}]}`,
		`{"require":[{"action":"read_file","min_bytes":-1}]}`,
		`{"require":[{"action":"exec","argv":"a","argv_glob":"b"}]}`,
		`{"require":[],"extra":1}`,
		`{} {}`,
		`{"deny":[{"action":"code","language":"bsh"}]}`,
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) accepted", bad)
		}
	}
}

func TestRulesMatch(t *testing.T) {
	p, err := Parse([]byte(`{
	  "require": [
	    {"action": "exec", "argv_glob": "*pip install *"},
	    {"action": "read_file", "min_bytes": 100},
	    {"action": "create", "above": {"cpus": 2}},
	    {"action": "mcp_tool", "tool": "write_file"},
	    {"action": "network"}
	  ],
	  "deny": [{"action": "exec", "argv": "rm -rf /($| )"}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	open := policy.Network{Mode: policy.NetOpen}
	none := policy.Network{Mode: policy.NetNone}
	al := func(hosts ...string) *policy.Network { return &policy.Network{Mode: policy.NetAllowlist, Allow: hosts} }
	for _, tc := range []struct {
		a    Action
		want string // deny, require or ""
	}{
		{Action{Kind: KindExec, Argv: []string{"/bin/sh", "-c", "pip install requests"}}, "require"},
		{Action{Kind: KindExec, Argv: []string{"pip", "list"}}, ""},
		{Action{Kind: KindExec, Argv: []string{"rm", "-rf", "/"}}, "deny"},
		{Action{Kind: KindExec, Argv: []string{"rm", "-rf", "/tmp/x"}}, ""},
		{Action{Kind: KindReadFile, Size: 100}, ""},
		{Action{Kind: KindReadFile, Size: 101}, "require"},
		{Action{Kind: KindCreate, Limits: &Limits{CPUs: 2}}, ""},
		{Action{Kind: KindCreate, Limits: &Limits{CPUs: 3}}, "require"},
		{Action{Kind: KindTool, Tool: "write_file"}, "require"},
		{Action{Kind: KindTool, Tool: "read_file"}, ""},
		{Action{Kind: KindNetwork, From: &none, To: &open}, "require"},
		{Action{Kind: KindNetwork, From: &open, To: &none}, ""},
		{Action{Kind: KindNetwork, From: al("a.com"), To: al("a.com", "b.com")}, "require"},
		{Action{Kind: KindNetwork, From: al("a.com", "b.com"), To: al("a.com")}, ""},
		{Action{Kind: KindNetwork, From: &policy.Network{Mode: policy.NetOpen, Deny: []string{"x.com"}}, To: &open}, "require"},
	} {
		v := judge(&tc.a, p)
		got := ""
		switch {
		case v.deny != nil:
			got = "deny"
		case v.require != nil:
			got = "require"
		}
		if got != tc.want {
			t.Errorf("%s: %q, want %q", tc.a.Summary(), got, tc.want)
		}
	}
}

// TestGateNoPolicy: without rules nothing is held or audited.
func TestGateNoPolicy(t *testing.T) {
	audited := 0
	g, err := New(Config{Audit: func(context.Context, string, string, string, any) error { audited++; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(context.Background(), Action{Kind: KindExec, Argv: []string{"rm", "-rf", "/"}}, nil); err != nil || audited != 0 {
		t.Fatalf("no policy: %v, %d audit events", err, audited)
	}
}

// TestGateAuditFailsClosed: a request the audit log cannot record is
// refused without asking anyone.
func TestGateAuditFailsClosed(t *testing.T) {
	p, _ := Parse([]byte(`{"require":[{"action":"exec"}]}`))
	boom := errors.New("disk full")
	g, _ := New(Config{Policy: p, Timeout: time.Hour, Audit: func(context.Context, string, string, string, any) error { return boom }})
	asked := false
	err := g.Check(context.Background(), Action{Kind: KindExec, Argv: []string{"ls"}}, func(context.Context, string) (bool, string, error) {
		asked = true
		return true, "", nil
	})
	if !errors.Is(err, boom) || asked {
		t.Fatalf("Check = %v (asked %v), want the audit error and nobody asked", err, asked)
	}
}

// TestGateElicitorAndClose: an elicitor's answer decides; Close denies
// what is still pending.
func TestGateElicitorAndClose(t *testing.T) {
	p, _ := Parse([]byte(`{"require":[{"action":"exec"}]}`))
	g, _ := New(Config{Policy: p, Timeout: time.Hour, Audit: func(context.Context, string, string, string, any) error { return nil }})
	yes := func(context.Context, string) (bool, string, error) { return true, "fine", nil }
	if err := g.Check(context.Background(), Action{Kind: KindExec}, yes); err != nil {
		t.Fatalf("approved by the elicitor: %v", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- g.Check(context.Background(), Action{Kind: KindExec, Argv: []string{"x"}}, nil) }()
	for len(g.List(func(*Pending) bool { return true })) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	g.Close()
	var ae *Error
	if err := <-errc; !errors.As(err, &ae) || ae.Code != CodeDenied || !strings.Contains(ae.Msg, "shutting down") {
		t.Fatalf("after Close: %v", err)
	}
}

func TestSignVerify(t *testing.T) {
	secret := []byte("0123456789abcdef")
	now := time.Now()
	ts := now.Unix()
	body := []byte(`{"decision":"approve"}`)
	sig := Sign(secret, ts, body)
	if err := Verify(secret, itoa(ts), sig, body, now); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		ts  string
		sig string
		b   []byte
	}{
		"other body":  {itoa(ts), sig, []byte(`{"decision":"deny"}`)},
		"other key":   {itoa(ts), Sign([]byte("fedcba9876543210"), ts, body), body},
		"stale":       {itoa(ts - 3600), Sign(secret, ts-3600, body), body},
		"no prefix":   {itoa(ts), strings.TrimPrefix(sig, "sha256="), body},
		"bad ts":      {"yesterday", sig, body},
		"moved stamp": {itoa(ts + 1), sig, body},
	} {
		if err := Verify(secret, c.ts, c.sig, c.b, now); !errors.Is(err, ErrSignature) {
			t.Errorf("%s: %v, want ErrSignature", name, err)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestGateNoElicitation: with NoElicitation the elicitor is never asked
// and an unanswered approval times out.
func TestGateNoElicitation(t *testing.T) {
	p, _ := Parse([]byte(`{"require":[{"action":"exec"}]}`))
	g, _ := New(Config{Policy: p, Timeout: 50 * time.Millisecond, NoElicitation: true,
		Audit: func(context.Context, string, string, string, any) error { return nil }})
	asked := false
	err := g.Check(context.Background(), Action{Kind: KindExec}, func(context.Context, string) (bool, string, error) {
		asked = true
		return true, "", nil
	})
	var ae *Error
	if !errors.As(err, &ae) || ae.Code != CodeTimeout || asked {
		t.Fatalf("Check = %v (asked %v), want %s without asking", err, asked, CodeTimeout)
	}
}

// TestParseYAML: a YAML policy means the same as its JSON, and is as
// strict about unknown fields.
func TestParseYAML(t *testing.T) {
	y := `
require:
  - action: exec
    argv: "rm -rf"
    reason: deletes files
  - action: create
    above: {memory_bytes: 1073741824, cpus: 1.5}
deny:
  - action: mcp_tool
    tool: "*"
`
	p, err := Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Require) != 2 || p.Require[0].Reason != "deletes files" || p.Require[1].Above.CPUs != 1.5 || p.Deny[0].Tool != "*" {
		t.Fatalf("parsed %+v", p)
	}
	if v := judge(&Action{Kind: KindExec, Argv: []string{"rm", "-rf", "x"}}, p); v.require == nil {
		t.Fatal("the YAML rule does not match")
	}
	for _, bad := range []string{"require:\n  - action: exec\n    argvv: x\n", "require: [\n", "- 1\n"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// TestCodeLanguageAliases: a code rule holds whatever name the request or
// the rule gives the language (aliases, case), and a code context about to
// start is gated as code of its language.
func TestCodeLanguageAliases(t *testing.T) {
	p, err := Parse([]byte(`{"deny":[{"action":"code","language":"sh"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"bash", "sh", "shell", "BASH", "Sh"} {
		for _, action := range []string{auditCode, auditCodeContext} {
			a := FromAudit("k", "sb", action, map[string]any{"language": l})
			if judge(&a, p).deny == nil {
				t.Errorf("%s in %s not denied", action, l)
			}
		}
	}
	for _, l := range []string{"", "python", "py", "js", "node", "typescript", "r"} {
		a := FromAudit("k", "sb", auditCode, map[string]any{"language": l})
		if judge(&a, p).deny != nil {
			t.Errorf("a %q cell denied by a bash rule", l)
		}
	}
	a := FromAudit("k", "sb", auditCodeContext, map[string]any{"language": "sh"})
	if a.Summary() != "start a bash code context in sandbox sb" {
		t.Errorf("summary %q", a.Summary())
	}
}
