//go:build race

package agent_test

func init() { raceEnabled = true }
