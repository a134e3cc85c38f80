#!/bin/sh
# faults.sh: the fault script of the crash-safety work (docs/SECURITY.md,
# "What a restart reconciles"). It runs ROUNDS rounds (default 20) of
# server/faults_linux_test.go's TestFaults: each kills `airlock serve` with
# SIGKILL at a random point of a create, an image pull, a gvisor pause, a
# snapshot or a template build (each at least once), restarts it and checks
# that no mount, loop device, cgroup, runsc state, uid lease, temporary file
# or store row is left beyond the live sandboxes, and that nothing at all
# is left after a final clean shutdown. Needs root; gvisor rounds need runsc.
#
# Then it creates and kills CHURN sandboxes (default 1000; native, image and
# gvisor in turn, every tenth with a memory or fork bomb) and checks again.
#
#   scripts/faults.sh [ROUNDS [CHURN]]   AIRLOCK_FAULTS_SEED=N reruns a given run
# CI runs the short form in `go test ./server/`: each kill point once with
# a fixed seed and a churn of 20.
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-20}
churn=${2:-1000}
AIRLOCK_FAULTS=$rounds AIRLOCK_CHURN=$churn exec go test -p 1 -count=1 -timeout 60m -v -run '^TestFaults$' ./server/
