package gvisor

import (
	"testing"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// TestPdeathsigSurvivesEgressNamespaces (issue 29, item 6): a running
// sandbox outlives the making of many egress namespaces, each of which ends
// the OS thread it ran on. Before, runsc was forked from whatever thread
// the goroutine ran on, with a parent-death signal bound to that thread:
// when a later egressNetns took that thread and ended it, the sandbox was
// killed (signal 9).
func TestPdeathsigSurvivesEgressNamespaces(t *testing.T) {
	if _, err := Available(); err != nil {
		t.Skipf("gvisor tier unavailable: %v", err)
	}
	p, err := policy.Preset(policy.Strict)
	if err != nil {
		t.Fatal(err)
	}
	p.Runtime = policy.RuntimeGVisor
	sb, err := Start(native.Config{Policy: p, Args: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	go sb.Wait()
	for i := 0; i < 100; i++ {
		ns, ls, err := egressNetns([]string{"127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			l.Close()
		}
		ns.Close()
	}
	select {
	case <-sb.Done():
	case <-time.After(2 * time.Second):
		return // still running
	}
	t.Fatalf("the sandbox ended while egress namespaces were made: %s", sb.ExitDetail())
}
