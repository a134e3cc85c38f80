package main

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/kube/agenttls"
)

// TestAgentPooledEnrollment: `airlock agent --listen --pool-ca`, a warm
// pool's agent started before its sandbox exists, run as an unprivileged
// process. Unclaimed, it serves nothing: the credentials of another sandbox
// of the same cluster (what a claimed sandbox's workload can read in its
// pod) get no connection, and neither does an agent-protocol client on
// plain TCP. Enrolled by a server's enroller with its sandbox's bundle, it
// serves that sandbox's token holder (exec runs) and nobody else, and it
// cannot be enrolled a second time.
func TestAgentPooledEnrollment(t *testing.T) {
	la := startAgentProcess(t, true)
	if !strings.Contains(la.stderr.String(), "pooled (not enrolled) listening on") {
		t.Errorf("agent log: %s", la.stderr)
	}
	other, err := la.ca.Issue("sb-pooled-other", 0)
	if err != nil {
		t.Fatal(err)
	}
	occ, err := other.ClientCreds()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agenttls.Dial(ctxT(t), la.addr, occ); err == nil {
		t.Fatal("another sandbox's credentials reached an unclaimed agent")
	}
	raw, err := net.Dial("tcp", la.addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agent.NewClient(raw); err == nil {
		t.Fatal("a plain agent client got a hello from an unclaimed agent")
	}

	e, err := la.ca.Enroller(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Enroll(ctxT(t), la.addr, la.bundle); err != nil {
		t.Fatalf("enroll: %v\nagent log:\n%s", err, la.stderr)
	}
	c := la.client(t) // the owner: the bundle's token
	if got := execOut(t, c, "echo claimed"); got != "claimed\n" {
		t.Errorf("exec after enrollment: %q", got)
	}
	if _, err := agenttls.Dial(ctxT(t), la.addr, occ); !errors.Is(err, agenttls.ErrWrongName) {
		t.Errorf("another sandbox's credentials after the claim: %v, want ErrWrongName", err)
	}
	if err := e.Enroll(ctxT(t), la.addr, other); err == nil {
		t.Error("a second enrollment succeeded")
	}
	if got := execOut(t, c, "echo still"); got != "still\n" {
		t.Errorf("the owner after a refused re-enrollment: %q", got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(la.stderr.String(), "enrolled as sandbox sb-listen") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(la.stderr.String(), "enrolled as sandbox sb-listen") {
		t.Errorf("the agent did not log its enrollment:\n%s", la.stderr)
	}
}
