#!/usr/bin/env bash
# Builds QuickJS for WASI: the JavaScript of the wasm tier's code contexts
# (interp/kernels/quickjs.js runs on it; runtime/wasm serves its host
# functions; docs/wasm.md). The source is QuickJS 2021-03-27 (MIT), as
# shipped under deps/ by the npm package qjsc 0.3.0 (the newest QuickJS
# source any registry reachable here serves: docs/RATIONALE.md), pinned by
# the tarball's SHA-256. wasi.patch ports its platform defines to WASI
# (no computed goto, no threads, directed rounding by hand); host.c is
# airlock's host program. Cached: nothing is rebuilt when the output's key
# (the tarball, the patch, host.c, this script and the compiler) matches.
#
# usage: scripts/quickjs/build.sh [OUTPUT]   (default /usr/local/lib/airlock/quickjs.wasm)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-/usr/local/lib/airlock/quickjs.wasm}
pkg=qjsc@0.3.0
tgz_sha=4a9ed1852b334d842d5dac42d1782817ae26310b448de39532451fd45c9ba0ee
src=quickjs_2021_03_27
cache=${AIRLOCK_QUICKJS_CACHE:-/var/cache/airlock/quickjs}
cc=${CC_WASM:-clang-14}

key=$( { echo "$tgz_sha"; cat "$here/wasi.patch" "$here/host.c" "$here/build.sh"; "$cc" --version | head -n1; } | sha256sum | cut -c1-64)
if [ -f "$out" ] && [ "$(cat "$out.key" 2>/dev/null)" = "$key" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$cache"
tgz=$cache/qjsc-0.3.0.tgz
if ! echo "$tgz_sha  $tgz" | sha256sum -c --status 2>/dev/null; then
  dl=$(mktemp -d)
  (cd "$dl" && npm pack --silent "$pkg" >/dev/null)
  mv "$dl"/qjsc-0.3.0.tgz "$tgz.part" && rm -rf "$dl"
  if ! echo "$tgz_sha  $tgz.part" | sha256sum -c --status; then
    echo "quickjs: $pkg from npm does not have the pinned SHA-256 $tgz_sha" >&2
    rm -f "$tgz.part"
    exit 1
  fi
  mv "$tgz.part" "$tgz"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$tgz" -C "$work" "package/deps/$src"
cd "$work/package/deps/$src"
patch -s -p1 <"$here/wasi.patch"
cp "$here/host.c" .
"$cc" --target=wasm32-wasi --sysroot=/usr -O2 -D_GNU_SOURCE -DCONFIG_VERSION='"2021-03-27"' -DCONFIG_BIGNUM \
  -Wno-everything -Wl,-z,stack-size=8388608 -Wl,--strip-all \
  -o quickjs.wasm host.c quickjs.c libregexp.c libunicode.c cutils.c libbf.c
mkdir -p "$(dirname "$out")"
install -m 0644 quickjs.wasm "$out.part"
mv "$out.part" "$out"
echo "$key" >"$out.key"
echo "$out"
