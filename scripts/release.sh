#!/usr/bin/env bash
# Builds airlock's release artifacts into dist/ (or $OUT) from this
# checkout's HEAD: linux/amd64 and linux/arm64 archives, .debs, CycloneDX
# SBOMs, an OCI image layout and SHA256SUMS (scripts/release/main.go says
# what each holds). Reproducible: every timestamp is the commit's.
#
#   scripts/release.sh [VERSION]       # VERSION: default from `git describe --tags`, else 0.1.0-dev
#   ARCH=amd64 OUT=/tmp/d scripts/release.sh 0.2.0
#
# A tree with uncommitted changes is refused (the artifacts would not match
# the commit they name) unless RELEASE_ALLOW_DIRTY=1; its commit then ends
# in "-dirty".
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
version="${1:-$(git describe --tags --abbrev=0 2>/dev/null | sed 's/^v//' || true)}"
version="${version:-0.1.0-dev}"
commit="$(git rev-parse HEAD)"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
	if [ "${RELEASE_ALLOW_DIRTY:-}" != 1 ]; then
		echo "release: the tree has uncommitted changes (commit them, or RELEASE_ALLOW_DIRTY=1)" >&2
		exit 1
	fi
	commit="$commit-dirty"
fi
date="$(TZ=UTC git show -s --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd HEAD)"
out="${OUT:-$root/dist}"
cd scripts/release
exec go run . -src "$root" -out "$out" -version "$version" -commit "$commit" -date "$date" -arch "${ARCH:-amd64,arm64}"
