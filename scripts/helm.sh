#!/usr/bin/env bash
# Builds the helm CLI (helm.sh/helm/v4 at $HELM_VERSION) from the Go module
# proxy, statically, outside airlock's go.mod (`go install pkg@version`: its
# own go.mod, its own dependency versions), and caches it by version:
#
#   scripts/helm.sh        # prints the binary's path (last line)
#
# The binary goes to $AIRLOCK_KUBE_CACHE (default /var/cache/airlock/kube)
# /helm/$HELM_VERSION/helm; a cached one (its embedded module version is
# $HELM_VERSION) is reused without running go. About 8 minutes cold (5 min of
# CPU) on this 2-core machine (docs/kubernetes-e2e.md). setup.sh --tests
# builds it in the background (scripts/kubernetes-e2e.sh's build, under the
# cache's build lock), right after kube-apiserver: package kube's chart
# tests wait for it, then the real-node e2e installs airlock with it.
#
# Keep HELM_VERSION in step with kube.HelmVersion (kube/assets.go; a test
# compares them).
set -euo pipefail
HELM_VERSION=${HELM_VERSION:-v4.3.1}
dir=${AIRLOCK_KUBE_CACHE:-/var/cache/airlock/kube}/helm/$HELM_VERSION
out=$dir/helm
if [ -x "$out" ] && go version -m "$out" 2>/dev/null | grep -q "mod[[:space:]]*helm.sh/helm/v4[[:space:]]*$HELM_VERSION[[:space:]]"; then
	echo "helm: $HELM_VERSION cached at $out" >&2
	echo "$out"
	exit 0
fi
echo "helm: building helm $HELM_VERSION from the Go module proxy (minutes cold)" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# internal/version.version: what `helm version` prints (helm's Makefile
# sets it the same way; without it, only "v4.3").
CGO_ENABLED=0 GOWORK=off GOFLAGS= GOBIN=$work \
	go install -trimpath -ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
	"helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
mkdir -p "$dir"
install -m 0755 "$work/helm" "$out.new"
mv -f "$out.new" "$out"
echo "helm: $("$out" version --short) at $out" >&2
echo "$out"
