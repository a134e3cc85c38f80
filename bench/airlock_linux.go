package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// AirlockCLI returns the airlock peer that runs a command the way a user
// does: exe (the airlock binary) is executed as `exe run -- CMD`, a fresh
// process each time, like every other peer. Its figure therefore includes
// the Go runtime's start, flag parsing, the strict policy, the sandbox and
// its teardown.
func AirlockCLI(exe string, timeout time.Duration) Peer {
	if timeout <= 0 {
		timeout = time.Minute
	}
	p := Peer{Name: Reference, Note: "airlock run -- CMD (the whole CLI, exec'ed: Go start, strict policy, sandbox, teardown)"}
	if exe == "" {
		p.Missing = "airlock binary unknown"
		return p
	}
	p.Run = func(argv []string) error {
		return runWith(timeout, runSpec{}, exe, append([]string{"run", "--"}, argv...)...)
	}
	return p
}

// nativeIdleNote says how airlock's idle sandboxes are started.
const nativeIdleNote = "native.Start(strict preset) of the idle command as PID 1, launched by the bench process (no agent)"

// AirlockInProcess returns the airlock peer that calls native.Run with the
// strict preset inside the bench process: the runtime's own cost without
// starting a Go program.
func AirlockInProcess() Peer {
	p := Peer{Name: Reference, Note: "native.Run(strict preset) inside the bench process (no CLI start)"}
	pol, err := policy.Preset(policy.Strict)
	if err != nil {
		p.Missing = "strict preset: " + err.Error()
		return p
	}
	p.Run = func(argv []string) error {
		res, err := native.Run(context.Background(), native.Config{Policy: pol, Args: argv}, native.RunOptions{})
		if err != nil {
			return err
		}
		if res.Status != native.StatusOK {
			return fmt.Errorf("status %s, exit code %d: %s", res.Status, res.ExitCode, res.Error)
		}
		return nil
	}
	return p
}

// startNativeIdle starts argv as PID 1 of a native sandbox with the strict
// preset, launched by the bench process.
func startNativeIdle(argv []string) (*Idle, error) {
	pol, err := policy.Preset(policy.Strict)
	if err != nil {
		return nil, err
	}
	sb, err := native.Start(native.Config{Policy: pol, Args: argv})
	if err != nil {
		return nil, err
	}
	return &Idle{Root: sb.Pid, Stop: sb.Destroy}, nil
}

// AirlockNativeIdle returns the density peer "airlock-sleep": a native
// sandbox (strict preset) whose init is the idle command itself, started by
// the bench process: the sandbox's own cost, without the agent.
func AirlockNativeIdle() Peer {
	return Peer{Name: "airlock-sleep", Note: nativeIdleNote, StartIdle: startNativeIdle}
}
