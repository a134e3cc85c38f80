#!/usr/bin/env bash
# Installs what airlock needs on a fresh Debian 12 machine (as root): Debian's
# python3 with numpy/pandas/matplotlib (the sandbox's interpreter), gVisor's
# runsc (--runtime gvisor), QuickJS for WASI (the wasm tier's JavaScript,
# built with clang + wasi-libc by scripts/quickjs/build.sh, cached), and the
# peers `airlock bench` compares against.
#
# With --tests it also installs what the test suite needs (the README's test
# command and .ci/run pass it):
#   clang + wasi-libc (installed for QuickJS anyway) build the wasm tier's C test module
#     (runtime/wasm/testdata/cguest);
#   chromium runs the dashboard's browser test (server/dashboard_browser_linux_test.go);
#   postgresql: the shared-database tests (internal/pgtest) start their own clusters with its binaries;
#   mmdebstrap: the Debian image of the images end-to-end test (imagestore/imagetest.DebianLayer, built
#     from the configured Debian mirror once and cached in /var/cache/airlock-test by content);
#   the desktop and browser images of the computer-use tests (tests/desktop; debimage.Desktop: Xvfb,
#     XFCE, xdotool, scrot, x11vnc, noVNC, Chromium; debimage.Browser: headless Chromium), built by
#     mmdebstrap in the background while the rest installs (~10 and ~6 minutes cold under load, at the
#     same time) and cached in /var/cache/airlock-test by content;
#   etcd-server + a kube-apiserver built from the Go module proxy (scripts/kube-assets.sh, cached by
#     version, several minutes cold; built in the background while the rest installs): the
#     Kubernetes backend's control-plane tests;
#   the real-node e2e (scripts/kubernetes-e2e.sh, run by tests/kubenode): Debian's containerd, runc
#     and CNI plugins, and kubectl, helm (scripts/helm.sh: also package kube's chart tests),
#     kubelet, kube-scheduler, kube-controller-manager and agent-sandbox's controller built from
#     the Go module proxy after kube-apiserver, cached by version under
#     /var/cache/airlock/kube (about 15 minutes cold under
#     load; docs/kubernetes-e2e.md). Not waited for: the build holds the cache's lock
#     ($AIRLOCK_KUBE_CACHE/build.lock) until it ends, its log is e2e-build.log next to it, and the
#     test waits for that lock;
#   the pinned npm packages of the E2B/MCP JavaScript scenarios and the dashboard's build check.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
tests=0
for a in "$@"; do
  case $a in
    --tests) tests=1 ;;
    *) echo "usage: $0 [--tests]" >&2; exit 2 ;;
  esac
done
pkgs=(python3 python3-numpy python3-pandas python3-matplotlib python3-requests bubblewrap crun runc stress-ng strace
      libcap2-bin util-linux curl iproute2 ca-certificates busybox-static
      qemu-system-x86 linux-image-cloud-amd64 erofs-utils clang lld wasi-libc libclang-rt-14-dev-wasm32 patch)
if ((tests)); then
  pkgs+=(chromium postgresql mmdebstrap etcd-server)
  # the real-node e2e's node (scripts/kubernetes-e2e.sh's need_pkgs; installed here, not by its
  # background build, so that no two apt-get run at once)
  pkgs+=(containerd containernetworking-plugins iptables conntrack openssl)
fi
if ((tests)); then
  pkgs+=(zsh fish mypy) # cmd/airlock's completion test parses zsh and fish scripts; mypy checks sdk/python's types
fi
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# QuickJS for WASI (~1 min cold; nothing when its key matches), built while
# the rest installs.
qjs_out=$(mktemp)
"$(dirname "$0")/quickjs/build.sh" >"$qjs_out" 2>&1 &
qjs_pid=$!
kube_pid=
if ((tests)); then
  # The longest step (a kube-apiserver build when not cached) runs while the
  # rest installs; then, in the same Go build cache (the same flags and
  # module versions: kube-apiserver's packages are reused), the real-node
  # e2e's binaries, which setup does not wait for. The chain holds the
  # cache's build lock from its start, so tests/kubenode (and any run of
  # scripts/kubernetes-e2e.sh) waits for it; the script sees the lock held
  # by its parent and does not take it again.
  kube_cache=${AIRLOCK_KUBE_CACHE:-/var/cache/airlock/kube}
  mkdir -p "$kube_cache"
  kube_out=$(mktemp)
  rm -f "$kube_out.rc"
  (
    exec 8>>"$kube_cache/build.lock"
    flock 8
    r=0
    "$(dirname "$0")/kube-assets.sh" >"$kube_out" || r=$?
    echo "$r" >"$kube_out.rc"
    [ "$r" = 0 ] || exit "$r"
    e2e_log="$kube_cache/e2e-build.log"
    {
      echo "setup: KUBE_E2E_BUILD_ONLY=1 scripts/kubernetes-e2e.sh, started $(date -u +%FT%TZ)"
      r=0
      KUBE_E2E_BUILD_ONLY=1 "$(dirname "$0")/kubernetes-e2e.sh" || r=$?
      echo "setup: exit $r, ended $(date -u +%FT%TZ)"
    } >"$e2e_log.tmp" 2>&1 </dev/null
    mv -f "$e2e_log.tmp" "$e2e_log"
  ) </dev/null 2>&1 &
  kube_pid=$!
fi
desktop_pid=
if ((tests)); then
  # The desktop and browser images (debimage/mkimage; mmdebstrap, a few
  # hundred MB of Debian packages each) build while the rest installs; a
  # cached build is a no-op.
  desktop_out=$(mktemp)
  (
    cd "$(dirname "$0")/.."
    mk="$desktop_out.mkimage"
    cache="${AIRLOCK_TEST_CACHE:-/var/cache/airlock-test}"
    go build -o "$mk" ./debimage/mkimage
    "$mk" -q -cache "$cache" browser &
    b=$!
    r=0
    "$mk" -q -cache "$cache" desktop || r=$?
    wait "$b" || r=$?
    rm -f "$mk"
    exit "$r"
  ) >"$desktop_out" 2>&1 &
  desktop_pid=$!
fi
if ((tests)) && [ -f tests/js/package.json ]; then
  (cd tests/js && npm ci --no-audit --no-fund --loglevel=error)
fi
# The dashboard's pinned build tools (esbuild, xterm.js): dashboard/dist is
# committed, and go test ./dashboard checks it is what these build.
if ((tests)) && [ -f dashboard/web/package.json ]; then
  (cd dashboard/web && npm ci --no-audit --no-fund --loglevel=error)
fi
if ((tests)) && [ -f tests/mcp-js/package.json ]; then
  (cd tests/mcp-js && npm ci --no-audit --no-fund --loglevel=error)
fi
if ((tests)) && [ -f tests/desktop/package.json ]; then
  (cd tests/desktop && npm ci --no-audit --no-fund --loglevel=error)
fi
# gVisor's runsc for --runtime gvisor, pinned (keep in step with
# runtime/gvisor.Version) and built statically: the only build that runs on
# these hosts; with gVisor's precompiled seccomp filters, which a plain
# `go install` build lacks (scripts/runsc-seccomp/build.sh says why and how).
# Skipped when /usr/local/bin/runsc already is this build (its --version
# is the version and a hash of the build scripts).
RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
runsc_stamp=$("$(dirname "$0")/runsc-seccomp/build.sh" --stamp "$RUNSC_VERSION")
if [ "$(/usr/local/bin/runsc --version 2>/dev/null | head -n1)" != "runsc version $runsc_stamp" ]; then
  "$(dirname "$0")/runsc-seccomp/build.sh" "$RUNSC_VERSION" /usr/local/bin/runsc
fi
echo "setup: runsc $RUNSC_VERSION at /usr/local/bin/runsc"
if ! wait "$qjs_pid"; then
  cat "$qjs_out" >&2
  echo "setup: scripts/quickjs/build.sh failed (its messages are above)" >&2
  exit 1
fi
echo "setup: QuickJS for WASI at $(tail -n1 "$qjs_out")"
rm -f "$qjs_out"
# The Kubernetes backend's control-plane tests (package kube): kube-apiserver
# built from the Go module proxy (cached by version under
# /var/cache/airlock/kube, ~7+ minutes cold) and Debian's etcd-server.
if [ -n "$kube_pid" ]; then
  # kube-assets.sh's end, not the chain's (the e2e build goes on).
  while [ ! -s "$kube_out.rc" ] && kill -0 "$kube_pid" 2>/dev/null; do sleep 2; done
  if [ "$(cat "$kube_out.rc" 2>/dev/null)" != 0 ]; then
    echo "setup: scripts/kube-assets.sh failed (its messages are above)" >&2
    exit 1
  fi
  echo "setup: kube test assets at $(tail -n1 "$kube_out")"
  rm -f "$kube_out" "$kube_out.rc"
  if kill -0 "$kube_pid" 2>/dev/null; then
    echo "setup: the real-node e2e's binaries still building in the background (log: $kube_cache/e2e-build.log when done, $kube_cache/e2e-build.log.tmp until then)"
  fi
fi
if [ -n "$desktop_pid" ]; then
  # Not waited for: a cold build takes ~10 minutes, and only tests/desktop
  # needs the images. It keeps building while the suite runs; those tests
  # take the cache's lock (debimage.Build) and so wait for it, or build the
  # images themselves (and report a failure) if this build failed.
  if kill -0 "$desktop_pid" 2>/dev/null; then
    echo "setup: desktop and browser images still building in the background (log: $desktop_out)"
  else
    echo "setup: desktop and browser images:"; cat "$desktop_out"
  fi
fi
echo "setup: ok"
