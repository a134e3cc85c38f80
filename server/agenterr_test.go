package server

import (
	"errors"
	"testing"

	"github.com/airlock-dev/airlock/agent"
)

// TestAgentTimeoutIs504: an agent's timeout (a code kernel that did not
// start) is a gateway timeout for the API, on the code and file paths, not
// a 500.
func TestAgentTimeoutIs504(t *testing.T) {
	ae := &agent.Error{Code: agent.CodeTimeout, Message: "the python kernel did not start in time"}
	var he *apiError
	if !errors.As(codeAgentErr(ae), &he) || he.status != 504 || he.code != "timeout" {
		t.Fatalf("codeAgentErr(timeout) = %#v, want 504 timeout", he)
	}
	if status, code, ok := agentStatus(ae); !ok || status != 504 || code != "timeout" {
		t.Fatalf("agentStatus(timeout) = %d %q %v, want 504 timeout", status, code, ok)
	}
}
