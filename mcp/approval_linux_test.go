package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/mcp"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/store"
)

// elicitSummary is the last line mcp-elicit.mjs prints.
type elicitSummary struct {
	OK       bool     `json:"ok"`
	Elicited []string `json:"elicited"`
	IsError  bool     `json:"is_error"`
	Text     string   `json:"text"`
	Exists   bool     `json:"exists"`
	Sandbox  string   `json:"sandbox"`
}

// TestTypeScriptClientElicitation: with an approval policy holding
// `rm -rf`, the server asks the official TypeScript client through
// elicitation/create; accepting runs the command, declining refuses it
// with a tool error that says why (and the directory stays). Both
// decisions are in the audit log, made by mcp-elicitation.
func TestTypeScriptClientElicitation(t *testing.T) {
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Skipf("%s/node_modules lacks @modelcontextprotocol/sdk (run scripts/setup.sh): %v", jsDir, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node_modules is installed but node is not in PATH: %v", err)
	}
	pol := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(pol, []byte(`{"require":[{"action":"exec","argv":"rm -rf","reason":"deletes files"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "--approval-policy", pol)
	key := s.newKey(t, "mcp-elicit")
	run := func(answer string) elicitSummary {
		cmd := exec.Command(node, "mcp-elicit.mjs", s.URL+"/mcp")
		cmd.Dir = jsDir
		cmd.Env = append(os.Environ(), "AIRLOCK_KEY="+key, "ANSWER="+answer)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		t.Logf("mcp-elicit.mjs %s:\n%s", answer, stderr.String())
		if err != nil {
			t.Fatalf("mcp-elicit.mjs: %v\nstdout: %s", err, stdout.String())
		}
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		var sum elicitSummary
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil || !sum.OK {
			t.Fatalf("summary %q: %v", stdout.String(), err)
		}
		if len(sum.Elicited) != 1 || !strings.Contains(sum.Elicited[0], "rm -rf /workspace/d") || !strings.Contains(sum.Elicited[0], "deletes files") {
			t.Fatalf("elicitations %q, want one naming the command and the rule", sum.Elicited)
		}
		return sum
	}
	acc := run("accept")
	if acc.IsError || acc.Exists {
		t.Fatalf("accepted: %+v, want the command run", acc)
	}
	dec := run("decline")
	if !dec.IsError || !dec.Exists || !strings.Contains(dec.Text, approval.CodeDenied) || !strings.Contains(dec.Text, "mcp-elicitation") {
		t.Fatalf("declined: %+v, want a tool error saying %s and the directory kept", dec, approval.CodeDenied)
	}

	st, err := store.Open(s.State)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	evs, err := st.AuditLog(ctx, store.AuditFilter{Action: approval.AuditDecided})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]approval.Decision{}
	for _, ev := range evs {
		var d struct {
			Decision approval.Decision `json:"decision"`
		}
		if err := json.Unmarshal(ev.Detail, &d); err != nil {
			t.Fatal(err)
		}
		got[ev.SandboxID] = d.Decision
	}
	if d := got[acc.Sandbox]; d.Decision != approval.Approve || d.By != "mcp-elicitation" || d.Reason != "the test approves" {
		t.Fatalf("audit of the accepted call (%s): %+v (all: %+v)", acc.Sandbox, d, got)
	}
	if d := got[dec.Sandbox]; d.Decision != approval.Deny || d.By != "mcp-elicitation" {
		t.Fatalf("audit of the declined call (%s): %+v (all: %+v)", dec.Sandbox, d, got)
	}
}

// TestOpenWorldHint: run_command and run_code say they reach the open
// world when the server gives its sandboxes network, and not otherwise.
func TestOpenWorldHint(t *testing.T) {
	for _, tc := range []struct {
		net  policy.Network
		want bool
	}{
		{policy.Network{Mode: policy.NetNone}, false},
		{policy.Network{Mode: policy.NetAllowlist, Allow: []string{"pypi.org"}}, true},
	} {
		e := newEnv(t, func(c *mcp.Config) { c.Network = tc.net })
		res, err := e.connect(t).ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, tool := range res.Tools {
			if tool.Name != "run_command" && tool.Name != "run_code" {
				continue
			}
			seen++
			if a := tool.Annotations; a == nil || a.OpenWorldHint == nil || *a.OpenWorldHint != tc.want {
				t.Errorf("network %s: %s openWorldHint %v, want %v", tc.net.Mode, tool.Name, a, tc.want)
			}
		}
		if seen != 2 {
			t.Fatalf("network %s: saw %d of run_command and run_code", tc.net.Mode, seen)
		}
	}
}
