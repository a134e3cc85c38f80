package server_test

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/manager"
)

// metricValue reads one counter from GET /metrics.
func metricValue(t *testing.T, e *e2e, name string) int64 {
	t.Helper()
	req, _ := http.NewRequest("GET", e.s.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\d+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("/metrics has no %s:\n%s", name, b)
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n
}

// TestE2EAnomalySignals: a fork storm against the pids limit, a program
// the OOM killer ends and a connection the egress proxy refuses each show
// on /metrics and as an anomaly.* audit event of their sandbox.
func TestE2EAnomalySignals(t *testing.T) {
	e := newE2E(t, "anomaly")
	for _, name := range []string{"airlock_sandbox_pids_limit_hits_total", "airlock_sandbox_oom_kills_total", "airlock_egress_denied_total"} {
		if n := metricValue(t, e, name); n != 0 {
			t.Fatalf("%s = %d before anything happened", name, n)
		}
	}
	sb := e.sandbox(t, client.CreateRequest{Limits: &client.Limits{Pids: 32, MemoryBytes: 96 << 20},
		Network: &client.Network{Mode: "allowlist", Allow: []string{"allowed.example"}}})
	// Fork storm: far more processes than the limit.
	e.c.Exec(e.ctx, sb.ID, client.ExecRequest{Shell: "for i in $(seq 80); do sleep 2 & done 2>/dev/null; wait", Timeout: 20})
	// Memory: more than the limit, in one go.
	e.c.Exec(e.ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", "b = bytearray(400 << 20)"}, Timeout: 20})
	// A destination the policy does not allow, through the SOCKS proxy.
	if r, err := e.c.Exec(e.ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", socksScript, "denied.example", "80", "hi"}, Timeout: 30}); err != nil {
		t.Fatal(err)
	} else if r.Stdout == "" {
		t.Logf("socks attempt: %+v", r)
	}
	for action, metric := range map[string]string{
		manager.AuditAnomalyPids:   "airlock_sandbox_pids_limit_hits_total",
		manager.AuditAnomalyOOM:    "airlock_sandbox_oom_kills_total",
		manager.AuditAnomalyEgress: "airlock_egress_denied_total",
	} {
		eventually(t, 30*time.Second, action+" audited", func() bool { return len(auditAction(t, e.state, sb.ID, action)) > 0 })
		if n := metricValue(t, e, metric); n < 1 {
			t.Errorf("%s = %d after the event", metric, n)
		}
	}
}
