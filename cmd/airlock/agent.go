package main

import "airlock/agent"

func init() {
	// __agent is the in-sandbox agent: the airlock binary bound read-only
	// at native.AgentPath and started as the sandbox's PID 1.
	hidden["__agent"] = func([]string) int {
		agent.Main()
		return 0 // not reached: Main exits
	}
}
