#!/bin/sh
# bench-peers.sh installs the peers `airlock bench` compares against:
# bubblewrap, crun and runc from Debian, and gVisor's runsc built statically
# from source (the static build is the one that runs on these machines).
# With --srt it also installs Anthropic's sandbox-runtime (srt) from npm,
# and the Debian packages srt needs at run time (ripgrep, socat).
#
# Usage: scripts/bench-peers.sh [--srt] [--no-apt] [--no-runsc]
# Environment:
#   BINDIR         where runsc is installed (default /usr/local/bin; if not
#                  writable the binary stays in the build dir, printed below)
#   RUNSC_VERSION  gvisor.dev/gvisor module version
#                  (default v0.0.0-20260905035102-160fafc42237)
#   SRT_PREFIX     npm prefix for srt (default /usr/local)
set -eu

RUNSC_VERSION=${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}
BINDIR=${BINDIR:-/usr/local/bin}
SRT_PREFIX=${SRT_PREFIX:-/usr/local}
do_apt=1 do_runsc=1 do_srt=0
for a in "$@"; do
	case $a in
	--srt) do_srt=1 ;;
	--no-apt) do_apt=0 ;;
	--no-runsc) do_runsc=0 ;;
	-h | --help)
		sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "bench-peers: unknown argument $a" >&2
		exit 2
		;;
	esac
done

SUDO=
if [ "$(id -u)" != 0 ]; then
	if command -v sudo >/dev/null 2>&1; then SUDO=sudo; fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-peers.XXXXXX")
build_pid=
cleanup() {
	if [ -n "$build_pid" ]; then kill "$build_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

# The runsc build takes minutes: start it first, in the background, outside
# any module so go.mod of the caller is not touched.
if [ "$do_runsc" = 1 ]; then
	echo "bench-peers: building runsc $RUNSC_VERSION in the background (log: $work/runsc-build.log)"
	(
		cd "$work" &&
			CGO_ENABLED=0 GOBIN="$work/bin" GOFLAGS= \
				go install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
	) >"$work/runsc-build.log" 2>&1 &
	build_pid=$!
fi

if [ "$do_apt" = 1 ]; then
	# Another apt may be running (e.g. an image's first-boot install):
	# wait for the dpkg lock instead of failing.
	apt_opts="-o DPkg::Lock::Timeout=900"
	echo "bench-peers: apt-get update && apt-get install bubblewrap crun runc"
	$SUDO apt-get $apt_opts update -q
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get $apt_opts install -y -q \
		--no-install-recommends bubblewrap crun runc
	if [ "$do_srt" = 1 ]; then
		DEBIAN_FRONTEND=noninteractive $SUDO apt-get $apt_opts install -y -q \
			--no-install-recommends ripgrep socat
	fi
fi

if [ "$do_srt" = 1 ]; then
	echo "bench-peers: npm install -g --prefix $SRT_PREFIX @anthropic-ai/sandbox-runtime"
	$SUDO npm install -g --prefix "$SRT_PREFIX" @anthropic-ai/sandbox-runtime
fi

runsc_path=
if [ -n "$build_pid" ]; then
	echo "bench-peers: waiting for the runsc build"
	if ! wait "$build_pid"; then
		build_pid=
		echo "bench-peers: runsc build failed:" >&2
		tail -n 30 "$work/runsc-build.log" >&2
		exit 1
	fi
	build_pid=
	if { [ -w "$BINDIR" ] || [ -n "$SUDO" ]; } && $SUDO install -m 0755 "$work/bin/runsc" "$BINDIR/runsc"; then
		runsc_path=$BINDIR/runsc
		rm -rf "$work"
	else
		runsc_path=$work/bin/runsc
		echo "bench-peers: $BINDIR not writable; runsc left at $runsc_path"
	fi
else
	rm -rf "$work"
fi

echo "bench-peers: installed peers:"
for p in bwrap crun runc; do
	if command -v $p >/dev/null 2>&1; then
		printf '  %-6s %s  (%s)\n' $p "$(command -v $p)" "$($p --version 2>&1 | head -n 1)"
	else
		printf '  %-6s missing\n' $p
	fi
done
if [ -n "$runsc_path" ]; then
	printf '  %-6s %s  (gvisor %s)\n' runsc "$runsc_path" "$RUNSC_VERSION"
fi
if [ "$do_srt" = 1 ]; then
	printf '  %-6s %s\n' srt "$SRT_PREFIX/bin/srt"
fi
