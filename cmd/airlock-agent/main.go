// Command airlock-agent is the in-sandbox agent alone: what `airlock
// serve --agent-binary` binds into each sandbox and starts as its PID 1
// instead of the whole airlock binary. It links only the agent, so every
// sandbox's agent starts faster and holds less memory (the package state
// of the server, the image store, MCP and the rest is not in it); see
// docs/benchmarks.md. Build it from the same checkout as airlock:
//
//	CGO_ENABLED=0 go build -o bin/ ./cmd/airlock ./cmd/airlock-agent
//
// It takes only what the server passes: "__agent" (the agent) and
// agent.StampArg (its build stamp, which the server compares with its own).
package main

import (
	"fmt"
	"os"

	"github.com/airlock-dev/airlock/agent"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "__agent":
			agent.Main() // exits
		case agent.StampArg:
			fmt.Println(agent.BuildStamp())
			os.Exit(0)
		}
	}
	fmt.Fprintln(os.Stderr, "airlock-agent: the in-sandbox agent of airlock serve (--agent-binary); not a command to run by hand")
	os.Exit(2)
}
