#!/usr/bin/env bash
# e2b-suites.sh: run E2B's own test suites against a local `airlock serve`
# and print pass/fail/skip counts: the JS SDK's (e2b-dev/E2B,
# packages/js-sdk, vitest: its unit, template and connectionConfig projects;
# not the browser or Cloudflare runtimes) and the code interpreter's
# (e2b-dev/code-interpreter, js). Not part of CI: slow, and some tests need
# the internet. Results and the classification of failures: docs/e2b.md.
#
# The SDKs run unchanged, as against E2B's cloud: E2B_DOMAIN=airlock.test,
# so the API is https://api.airlock.test and a sandbox's envd
# https://49983-SANDBOXID.airlock.test, served by `airlock serve
# --e2b-domain airlock.test` with a certificate of a throwaway CA
# (NODE_EXTRA_CA_CERTS) on ADDR:443. Node resolves *.airlock.test to ADDR
# through a preloaded dns.lookup shim (NODE_OPTIONS=--require), so nothing
# on the machine (/etc/hosts, DNS) changes. E2B's mocked tests (msw) match
# https://api.$E2B_DOMAIN and work too.
#
# Usage (as root, after scripts/setup.sh --tests):
#   scripts/e2b-suites.sh [js|ci|both]
# Environment:
#   E2B_SRC, CI_SRC   git directories (bare or not) or URLs of the two
#                     repositories (default: GitHub); checked out at
#                     E2B_COMMIT / CI_COMMIT (the commits measured in
#                     docs/e2b.md)
#   CACHE             where sources and npm packages are kept
#                     (~/.cache/airlock-e2b-suites); npm runs only when the
#                     dependency list changes, git only for a missing commit
#   ADDR              loopback address to listen on, port 443 (127.0.0.86)
#   RUNTIME           airlock serve --default-runtime (native)
#   OUT               where the JSON reports and server log go (a temp dir)
set -euo pipefail

which=${1:-both}
E2B_SRC=${E2B_SRC:-https://github.com/e2b-dev/E2B}
CI_SRC=${CI_SRC:-https://github.com/e2b-dev/code-interpreter}
E2B_COMMIT=${E2B_COMMIT:-b8029973aa7da5f741f7bb1a9f833b38a0885438}
CI_COMMIT=${CI_COMMIT:-7df1757bfd5baa037f909ce97c2dbe014da973c0}
CACHE=${CACHE:-$HOME/.cache/airlock-e2b-suites}
ADDR=${ADDR:-127.0.0.86}
RUNTIME=${RUNTIME:-native}
OUT=${OUT:-$(mktemp -d /tmp/e2b-suites.XXXXXX)}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$CACHE/work
mkdir -p "$work" "$OUT"

# checkout SRC COMMIT DIR: the tree of COMMIT in DIR (kept between runs).
checkout() {
	local src=$1 commit=$2 dir=$3 git=$CACHE/$(basename "$3").git
	[ -f "$dir/.commit" ] && [ "$(cat "$dir/.commit")" = "$commit" ] && return 0
	if [ -d "$src" ]; then
		git=$src
		[ -d "$src/.git" ] && git=$src/.git
	elif ! git --git-dir="$git" cat-file -e "$commit^{commit}" 2>/dev/null; then
		rm -rf "$git"
		git clone -q --bare "$src" "$git"
	fi
	rm -rf "$dir" && mkdir -p "$dir"
	git --git-dir="$git" archive "$commit" | tar -x -C "$dir"
	echo "$commit" >"$dir/.commit"
}
checkout "$E2B_SRC" "$E2B_COMMIT" "$work/E2B"
checkout "$CI_SRC" "$CI_COMMIT" "$work/ci"

# One node_modules above both trees: the JS SDK's runtime dependencies and
# test tools, and for the code interpreter the newest e2b from npm.
cat >"$work/package.json.new" <<'EOF'
{ "name": "airlock-e2b-suites", "private": true,
  "dependencies": {
    "@bufbuild/protobuf": "^2.12.1", "@connectrpc/connect": "^2.1.2", "@connectrpc/connect-web": "^2.1.2",
    "chalk": "^5.3.0", "compare-versions": "^6.1.0", "dockerfile-ast": "^0.7.1", "glob": "^13.0.6",
    "openapi-fetch": "^0.14.1", "platform": "^1.3.6", "tar": "^7.5.19", "undici": "^7.29.0",
    "undici8": "npm:undici@8.10.0", "vitest": "^4.1.10", "msw": "^2.12.10", "dotenv": "^16.4.5",
    "error-stack-parser-es": "^2.0.1", "e2b": "2.51.0"
  } }
EOF
if ! cmp -s "$work/package.json.new" "$work/package.json" || [ ! -d "$work/node_modules/vitest" ]; then
	mv "$work/package.json.new" "$work/package.json"
	(cd "$work" && npm install --no-audit --no-fund --loglevel=error)
else
	rm "$work/package.json.new"
fi

# The server: a fresh state directory, a key, TLS for *.airlock.test.
(cd "$repo" && CGO_ENABLED=0 go build -o "$OUT/airlock" ./cmd/airlock)
tls=$OUT/tls
mkdir -p "$tls"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=airlock e2b-suites CA" \
	-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" \
	-keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=airlock.test" \
	-keyout "$tls/srv.key" -out "$tls/srv.csr" 2>/dev/null
printf 'subjectAltName=DNS:*.airlock.test,DNS:airlock.test\nextendedKeyUsage=serverAuth\n' >"$tls/ext"
openssl x509 -req -in "$tls/srv.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial -days 2 \
	-extfile "$tls/ext" -out "$tls/srv.pem" 2>/dev/null
state=$OUT/state
mkdir -p "$state"
key=$("$OUT/airlock" keys create --name e2b-suites --e2b --state-dir "$state" 2>/dev/null | tail -1)
"$OUT/airlock" serve --listen "$ADDR:443" --tls-cert "$tls/srv.pem" --tls-key "$tls/srv.key" \
	--e2b-domain airlock.test --state-dir "$state" --max-sandboxes 64 --default-runtime "$RUNTIME" \
	>"$OUT/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
	grep -q 'airlock: listening' "$OUT/serve.log" && break
	kill -0 "$server" || { cat "$OUT/serve.log"; exit 1; }
	sleep 0.2
done

cat >"$OUT/dnsshim.cjs" <<'EOF'
// *.airlock.test (and airlock.test) resolve to the suite's server.
const dns = require('node:dns')
const addr = process.env.AIRLOCK_SUITE_ADDR
const domain = '.' + process.env.E2B_DOMAIN
const lookup = dns.lookup
dns.lookup = function (host, opts, cb) {
  if (typeof opts === 'function') { cb = opts; opts = {} }
  if (typeof host === 'string' && (host.endsWith(domain) || host === domain.slice(1))) {
    if (opts && opts.all) return process.nextTick(cb, null, [{ address: addr, family: 4 }])
    return process.nextTick(cb, null, addr, 4)
  }
  return lookup.call(this, host, opts, cb)
}
EOF
export E2B_DOMAIN=airlock.test E2B_API_KEY=$key AIRLOCK_SUITE_ADDR=$ADDR
export NODE_EXTRA_CA_CERTS=$tls/ca.pem NODE_OPTIONS="--require $OUT/dnsshim.cjs"
unset E2B_API_URL E2B_SANDBOX_URL E2B_DEBUG E2B_ACCESS_TOKEN

# The JS SDK's vitest projects without the browser one (which needs
# Playwright's Chromium and only re-runs sandbox calls from a browser,
# which airlock refuses: docs/api.md, Origin).
cat >"$work/E2B/packages/js-sdk/vitest.airlock.mts" <<'EOF'
import { defineConfig } from 'vitest/config'
const setupFiles = ['tests/globalFetchFallback.setup.ts']
export default defineConfig({
  test: {
    projects: [
      { test: { name: 'unit', include: ['tests/**/*.test.ts'],
          exclude: ['tests/runtimes/**', 'tests/template/**', 'tests/connectionConfig.test.ts', 'tests/connectionConfig.browser.test.ts'],
          isolate: true, globals: false, testTimeout: 60_000, environment: 'node', setupFiles, deps: { interopDefault: true } } },
      { test: { name: 'template', include: ['tests/template/**/*.test.ts'], globals: false, testTimeout: 180_000,
          environment: 'node', setupFiles } },
      { test: { name: 'connectionConfig', include: ['tests/connectionConfig.test.ts'], globals: false, isolate: true,
          testTimeout: 10_000, environment: 'node' } },
    ],
  },
})
EOF
cat >"$work/ci/js/vitest.airlock.mts" <<'EOF'
import { defineConfig } from 'vitest/config'
export default defineConfig({
  test: { include: ['tests/**/*.test.ts'], exclude: ['tests/runtimes/**'], globals: false,
    testTimeout: 60_000, environment: 'node', deps: { interopDefault: true } },
})
EOF

# summary REPORT EXCLUDE WHAT: counts, and the failures one a line; tests
# whose "file :: name" matches EXCLUDE (a regexp: WHAT) are counted apart.
summary() {
	node - "$1" "$2" "$3" <<'EOF'
const fs = require('node:fs')
const [report, exclude, what] = process.argv.slice(2)
const r = JSON.parse(fs.readFileSync(report, 'utf8'))
const ex = exclude ? new RegExp(exclude) : null
const all = { passed: 0, failed: 0, skipped: 0 }, kept = { passed: 0, failed: 0, skipped: 0 }
const fails = []
for (const f of r.testResults) {
  const file = f.name.replace(/.*?\/tests\//, 'tests/')
  if (f.status === 'failed' && f.assertionResults.length === 0) fails.push(`${file}: the file failed: ${(f.message || '').split('\n')[0]}`)
  for (const t of f.assertionResults) {
    const s = t.status === 'passed' ? 'passed' : t.status === 'failed' ? 'failed' : 'skipped'
    all[s]++
    const excluded = ex && ex.test(`${file} :: ${t.fullName}`)
    if (!excluded) kept[s]++
    if (s === 'failed') fails.push(`${excluded ? '(excluded) ' : ''}${file} :: ${t.fullName} :: ${(t.failureMessages[0] || '').split('\n')[0].slice(0, 200)}`)
  }
}
const pct = (p, n) => (n ? (100 * p / n).toFixed(1) : '0') + '%'
console.log(`all: ${all.passed} passed, ${all.failed} failed, ${all.skipped} skipped`)
if (ex) console.log(`without the tests that ${what}: ${kept.passed}/${kept.passed + kept.failed} passed (${pct(kept.passed, kept.passed + kept.failed)}), ${kept.skipped} skipped`)
for (const l of fails) console.log('  FAIL ' + l)
EOF
}

echo "airlock $(git -C "$repo" rev-parse --short HEAD), runtime $RUNTIME; reports in $OUT"
if [ "$which" = js ] || [ "$which" = both ]; then
	echo "== e2b-dev/E2B $E2B_COMMIT packages/js-sdk"
	(cd "$work/E2B/packages/js-sdk" && npx vitest run --config vitest.airlock.mts --reporter=json \
		--outputFile="$OUT/js-sdk.json" >"$OUT/js-sdk.log" 2>&1) || true
	# Tests that need the public internet or E2B's cloud (docs/e2b.md).
	summary "$OUT/js-sdk.json" "$(tr -d '\n' <<'EOF'
internetAccess\.test\.ts :: internet access (enabled|default)|network\.test\.ts :: (allow only|deny specific|allow takes|updateNetwork|firewall transform)
|template/(backgroundBuild|build|tags|methods/makeSymlink|methods/runCmd)\.test\.ts :: (build template|make symlink|run command|assign single|rejects invalid)
EOF
)" "need the public internet or E2B's cloud"
fi
if [ "$which" = ci ] || [ "$which" = both ]; then
	echo "== e2b-dev/code-interpreter $CI_COMMIT js"
	(cd "$work/ci/js" && npx vitest run --config vitest.airlock.mts --reporter=json \
		--outputFile="$OUT/code-interpreter.json" >"$OUT/code-interpreter.log" 2>&1) || true
	# R, Java and systemd: what the brief of issue 32 leaves out.
	summary "$OUT/code-interpreter.json" 'env_vars/(r|java)\.test|systemd\.test| :: cwd (r|java)$' "need R, Java or systemd"
fi
