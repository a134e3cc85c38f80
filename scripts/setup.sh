#!/usr/bin/env bash
# Installs what airlock and its tests need on a fresh Debian 12 machine (as root):
# Debian's python3 with numpy/pandas/matplotlib (the sandbox's interpreter),
# the peers `airlock bench` compares against, and the tools hostile tests use.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs=(python3 python3-numpy python3-pandas python3-matplotlib python3-requests bubblewrap crun runc stress-ng strace
      libcap2-bin util-linux curl iproute2 ca-certificates)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ -f tests/js/package.json ]; then
  (cd tests/js && npm ci --no-audit --no-fund --loglevel=error)
fi
if [ -f tests/mcp-js/package.json ]; then
  (cd tests/mcp-js && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "setup: ok"
