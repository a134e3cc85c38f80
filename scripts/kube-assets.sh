#!/usr/bin/env bash
# Lays out a control plane for airlock's Kubernetes tests: a directory usable as
# KUBEBUILDER_ASSETS (controller-runtime's envtest) holding kube-apiserver and
# etcd, and prints its path on the last line of stdout.
#
#   kube-apiserver: built from the Go module proxy (k8s.io/kubernetes at
#     $KUBE_VERSION, in a throwaway module that replaces the k8s.io/* staging
#     modules with their published v0.x.y versions), CGO_ENABLED=0. About 7+
#     minutes cold on a 2-core machine, so the result is cached by version under
#     $AIRLOCK_KUBE_CACHE/<version>/ (default /var/cache/airlock/kube) and
#     reused when already there.
#   etcd: Debian's etcd-server package (installed here when missing; root).
#   kubectl: also built when KUBE_ASSETS_KUBECTL=1 (not needed by the tests).
#
# Tests (package kube) look for the assets in $KUBEBUILDER_ASSETS, then in
# $AIRLOCK_KUBE_CACHE/$KUBE_VERSION/bin; keep KUBE_VERSION in step with
# kube.AssetsVersion.
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
CACHE=${AIRLOCK_KUBE_CACHE:-/var/cache/airlock/kube}
dir="$CACHE/$KUBE_VERSION"
bin="$dir/bin"
mkdir -p "$bin"

log() { echo "kube-assets: $*" >&2; }

build() { # build <cmd name>: builds k8s.io/kubernetes/cmd/<name> into $bin
  local name=$1
  if [ -x "$bin/$name" ] && go version -m "$bin/$name" 2>/dev/null | grep -q "mod[[:space:]]*k8s.io/kubernetes[[:space:]]*$KUBE_VERSION"; then
    log "$name $KUBE_VERSION cached at $bin/$name"
    return
  fi
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  log "building $name $KUBE_VERSION from the Go module proxy (several minutes cold)"
  (
    cd "$work"
    export GOFLAGS=-mod=mod CGO_ENABLED=0 GOWORK=off
    go mod init airlock.local/kube-assets >/dev/null 2>&1
    go mod edit -go=1.24 -require="k8s.io/kubernetes@$KUBE_VERSION"
    # k8s.io/kubernetes's own go.mod points its staging modules at
    # ./staging/src/...; outside its tree they are the published v0.x.y.
    local minor=${KUBE_VERSION#v1.}
    local staging
    staging=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
    for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$staging"); do
      go mod edit -replace="$m=$m@v0.$minor"
    done
    go build -trimpath -ldflags="-s -w" -o "$work/$name" "k8s.io/kubernetes/cmd/$name"
  )
  install -m 0755 "$work/$name" "$bin/$name.tmp"
  mv -f "$bin/$name.tmp" "$bin/$name"
  log "$name $KUBE_VERSION built at $bin/$name"
}

build kube-apiserver
if [ "${KUBE_ASSETS_KUBECTL:-0}" = 1 ]; then build kubectl; fi

if ! command -v etcd >/dev/null && [ ! -x /usr/bin/etcd ]; then
  log "installing Debian's etcd-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends etcd-server >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends etcd-server >/dev/null; }
  # The package starts a system etcd on 2379; the tests run their own on
  # free ports, so the service is not wanted.
  if command -v systemctl >/dev/null; then systemctl disable --now etcd >/dev/null 2>&1 || true; fi
fi
etcd=$(command -v etcd || echo /usr/bin/etcd)
ln -sf "$etcd" "$bin/etcd"
"$bin/etcd" --version >/dev/null
log "etcd $("$bin/etcd" --version | sed -n 's/^etcd Version: //p') at $bin/etcd"
echo "$bin"
