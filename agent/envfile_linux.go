package agent

import (
	"bytes"
	"fmt"
	"os"
	"strings"
)

// envFile replaces the agent's environment, from which every workload's
// starts, with the NUL-separated KEY=VALUE entries of the file named by
// "--env-file=PATH" when args have it: how a microVM guest's agent gets
// the policy's environment, which cannot travel on the kernel command line.
func envFile(args []string) error {
	var path string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--env-file="); ok {
			path = v
		}
	}
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("env file: %w", err)
	}
	os.Clearenv()
	for _, kv := range bytes.Split(b, []byte{0}) {
		if len(kv) == 0 {
			continue
		}
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok || k == "" {
			return fmt.Errorf("env file: bad entry %q", kv)
		}
		if err := os.Setenv(k, v); err != nil {
			return fmt.Errorf("env file: %w", err)
		}
	}
	return nil
}
