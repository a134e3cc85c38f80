#!/usr/bin/env bash
# Installs what airlock and its tests need on a fresh Debian 12 machine (as root):
# Debian's python3 with numpy/pandas/matplotlib (the sandbox's interpreter),
# the peers `airlock bench` compares against, and the tools hostile tests use.
# clang + wasi-libc build the wasm tier's C test module (runtime/wasm/testdata/cguest).
# chromium runs the dashboard's browser test (server/dashboard_browser_linux_test.go).
# postgresql: the shared-database tests (internal/pgtest) start their own clusters with its binaries.
# mmdebstrap: the Debian image of the images end-to-end test (imagestore/imagetest.DebianLayer, built
# from the configured Debian mirror once and cached in /var/cache/airlock-test by content).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(python3 python3-numpy python3-pandas python3-matplotlib python3-requests bubblewrap crun runc stress-ng strace
      libcap2-bin util-linux curl iproute2 ca-certificates busybox-static
      clang lld wasi-libc libclang-rt-14-dev-wasm32 chromium postgresql mmdebstrap)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ -f tests/js/package.json ]; then
  (cd tests/js && npm ci --no-audit --no-fund --loglevel=error)
fi
# The dashboard's pinned build tools (esbuild, xterm.js): dashboard/dist is
# committed, and go test ./dashboard checks it is what these build.
if [ -f dashboard/web/package.json ]; then
  (cd dashboard/web && npm ci --no-audit --no-fund --loglevel=error)
fi
if [ -f tests/mcp-js/package.json ]; then
  (cd tests/mcp-js && npm ci --no-audit --no-fund --loglevel=error)
fi
# gVisor's runsc for --runtime gvisor, pinned (keep in step with
# runtime/gvisor.Version) and built statically: the only build that runs on
# these hosts. Skipped when /usr/local/bin/runsc already is this build.
RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
if ! go version -m /usr/local/bin/runsc 2>/dev/null | grep -q "mod[[:space:]]*gvisor.dev/gvisor[[:space:]]*$RUNSC_VERSION"; then
  work=$(mktemp -d)
  (cd "$work" && CGO_ENABLED=0 GOBIN="$work/bin" GOFLAGS= go install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION")
  install -m 0755 "$work/bin/runsc" /usr/local/bin/runsc
  rm -rf "$work"
fi
echo "setup: runsc $RUNSC_VERSION at /usr/local/bin/runsc"
# The Kubernetes backend's control-plane tests (package kube): kube-apiserver
# built from the Go module proxy (cached by version under
# /var/cache/airlock/kube, ~7+ minutes cold) and Debian's etcd-server.
kube_assets=$("$(dirname "$0")/kube-assets.sh")
echo "setup: kube test assets at $kube_assets"
echo "setup: ok"
