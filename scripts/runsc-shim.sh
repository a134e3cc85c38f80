#!/usr/bin/env bash
# Builds gVisor's containerd shim, containerd-shim-runsc-v1, from the gVisor
# module version VERSION (go.mod's, the one scripts/setup.sh builds runsc
# from), statically, and caches it by version and by the content of this
# script:
#
#   scripts/runsc-shim.sh [VERSION]     # prints the binary's path (last line)
#   scripts/runsc-shim.sh --stamp VERSION
#
# The binary goes to $AIRLOCK_RUNSC_SHIM_CACHE (default
# /var/cache/airlock/runsc-shim)/STAMP/containerd-shim-runsc-v1, where STAMP
# is VERSION+HASH (HASH: of this file); a cached one is reused without
# running go. The shim runs /usr/local/bin/runsc (the runsc setup.sh built;
# containerd's runtime options name it), so it carries none of its own.
#
# Built in a throwaway module requiring gvisor.dev/gvisor@VERSION (the
# shim's containerd dependencies resolve through the Go module proxy).
#
# One change, in a copy of the module (replace directive; Go refuses
# overlays of the module cache): the shim's start sets its
# long-running process's oom_score_adj to -999 and fails the pod if it
# cannot ("failed to set OOM Score on shim: ... permission denied"), which
# is every pod on a host whose root lacks CAP_SYS_RESOURCE, as this
# project's VMs (CapEff 000001fffeffffff: bit 24 clear; the same reason the
# node's containerd runs with restrict_oom_score_adj). With the change a
# permission error leaves the shim with containerd's score (silently: the
# start command's output is the address containerd reads, so it cannot
# log there); any other error still fails. Where root may lower the
# score, the write succeeds and nothing differs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
stamp() { echo "$1+$(sha256sum <"$here/runsc-shim.sh" | cut -c1-12)"; }
if [ "${1-}" = --stamp ]; then
	stamp "$2"
	exit
fi
version=${1:-$(awk '$1 == "gvisor.dev/gvisor" {print $2}' "$here/../go.mod")}
[ -n "$version" ] || {
	echo "runsc-shim: no gVisor version (argument, or gvisor.dev/gvisor in go.mod)" >&2
	exit 1
}
dir=${AIRLOCK_RUNSC_SHIM_CACHE:-/var/cache/airlock/runsc-shim}/$(stamp "$version")
out=$dir/containerd-shim-runsc-v1
if [ -x "$out" ] && go version -m "$out" 2>/dev/null | grep -q "gvisor.dev/gvisor[[:space:]]*$version"; then
	echo "runsc-shim: $version cached" >&2
	echo "$out"
	exit 0
fi
echo "runsc-shim: building containerd-shim-runsc-v1 from gvisor.dev/gvisor@$version" >&2
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
(
	cd "$work"
	export GOFLAGS=-mod=mod CGO_ENABLED=0 GOWORK=off
	go mod init airlock.local/runsc-shim >/dev/null 2>&1
	go mod edit -go=1.26 -require="gvisor.dev/gvisor@$version"
	mod=$(go mod download -json "gvisor.dev/gvisor@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -f "$mod/pkg/shim/v1/manager.go" ] || {
		echo "runsc-shim: no pkg/shim/v1/manager.go in gvisor.dev/gvisor@$version ($mod)" >&2
		exit 1
	}
	cp -r "$mod" gvisor
	chmod -R u+w gvisor
	perl -0pi -e 's/(\tif err := sys\.SetOOMScore\(cmd\.Process\.Pid, oomScoreMax\); err != nil \{\n)(\t\treturn shim\.BootstrapParams\{\}, fmt\.Errorf\("failed to set OOM Score on shim: %w", err\)\n)(\t\})/$1\t\t\/\/ airlock: a host whose root lacks CAP_SYS_RESOURCE keeps the parent\x27s score (scripts\/runsc-shim.sh).\n\t\tif !os.IsPermission(err) {\n\t$2\t\t}\n$3/' \
		gvisor/pkg/shim/v1/manager.go
	grep -q 'airlock: a host whose root lacks CAP_SYS_RESOURCE' gvisor/pkg/shim/v1/manager.go || {
		echo "runsc-shim: gvisor.dev/gvisor@$version's shim sets its OOM score differently: update the change in $0" >&2
		exit 1
	}
	go mod edit -replace="gvisor.dev/gvisor=./gvisor"
	# -trimpath: the copy's directory (new each build) stays out of the
	# Go build cache's keys, so a rebuild of the same inputs is cached.
	go build -trimpath -ldflags="-s -w" -o shim gvisor.dev/gvisor/shim
)
mkdir -p "$dir"
install -m 0755 "$work/shim" "$out.new"
mv -f "$out.new" "$out"
echo "$out"
