// Package gvisor is airlock's second isolation tier: the same policy and
// the same root tree as runtime/native, run behind gVisor's user-space
// kernel (runsc, systrap platform) so that the sandbox's system calls are
// served by gVisor's sentry and never reach the host kernel directly.
//
// A sandbox is an OCI bundle built from the policy (runtime/native's root
// template and mounts, via native.RootLayout) and run by `runsc run` as
// root, inside an airlock cgroup that carries the memory, pids and CPU
// limits. A live sandbox (one with an agent), and any with network, runs
// with --network=host inside a network namespace of its own, pinned under
// StateBase, that holds only loopback, the agent's reconnect listener
// (AgentAddr) and the egress proxy's listeners (see egressNetns); a one-shot
// run without network runs with --network=none.
package gvisor

import "errors"

// Version is the gVisor module version airlock is built and tested
// against; scripts/setup.sh installs exactly this runsc.
const Version = "v0.0.0-20260905035102-160fafc42237"

// InstallHint says how to get runsc.
const InstallHint = "install it with scripts/setup.sh (builds gVisor's runsc " + Version + " statically into /usr/local/bin/runsc), or set AIRLOCK_RUNSC to its path"

// ErrUnavailable is wrapped by the error returned when the gvisor tier
// cannot be used on this host.
var ErrUnavailable = errors.New("gvisor runtime unavailable")
