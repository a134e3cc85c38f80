//go:build linux

// Command leanrun is the yardstick of the CLI floor in docs/benchmarks.md:
// `leanrun CMD [ARG ...]` runs CMD in a native sandbox with the strict
// preset, as `airlock run -- CMD` does, from a binary that links only
// runtime/native and policy. The difference between the two is the cost of
// starting the full airlock binary (its package initialisation), not of the
// sandbox.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: leanrun CMD [ARG ...]")
		os.Exit(2)
	}
	pol, err := policy.Preset(policy.Strict)
	if err != nil {
		fmt.Fprintln(os.Stderr, "leanrun: strict preset:", err)
		os.Exit(1)
	}
	res, err := native.Run(context.Background(), native.Config{Policy: pol, Args: os.Args[1:]}, native.RunOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "leanrun:", err)
		os.Exit(1)
	}
	if res.Status != native.StatusOK && res.Status != native.StatusNonzeroExit {
		fmt.Fprintf(os.Stderr, "leanrun: %s: %s\n", res.Status, res.Error)
		os.Exit(1)
	}
	os.Exit(res.ExitCode)
}
