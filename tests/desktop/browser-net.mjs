// playwright-core on the host drives headless Chromium in a sandbox of the
// browser image (over CDP through airlock's ports relay) whose network is an
// allowlist with a credential for secret.test:
//
//   - WEB_URL (allowed) loads through the egress proxy;
//   - OTHER_HTTPS and OTHER_HTTP (a host not on the allowlist) fail to load:
//     the proxy refuses the CONNECT (Chromium: net::ERR_TUNNEL_CONNECTION_FAILED)
//     and answers plain HTTP with its 403 and the reason;
//   - SECRET_URL loads with the header the proxy injected (the outside server
//     answers auth-ok only when it got it), over TLS that Chromium verified
//     against the sandbox's egress CA.
//
//   AIRLOCK_KEY=... CDP_URL=ws://... WEB_URL=... OTHER_HTTP=... OTHER_HTTPS=... SECRET_URL=... node browser-net.mjs
//
// The last line printed is a JSON summary for browsernet_linux_test.go.
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const log = (...a) => console.error('[browser-net]', ...a);
const env = process.env;
const browser = await chromium.connectOverCDP(env.CDP_URL, {
  headers: { Authorization: `Bearer ${env.AIRLOCK_KEY}` },
  timeout: 120_000,
});
const context = browser.contexts()[0] ?? (await browser.newContext());
// A fresh tab for each load: a failed load's error page must not race
// the next navigation.
let page = await context.newPage();
const fresh = async () => {
  await page.close();
  page = await context.newPage();
};
const text = async () => (await page.locator('#r').textContent({ timeout: 30_000 })) ?? '';

// Allowed: through the proxy to the outside server.
let res = await page.goto(env.WEB_URL, { timeout: 60_000 });
assert.equal(res.status(), 200);
const web = await text();
log('allowed page:', web);
assert.match(web, /^web-ok host=web\.test:/);

// Not on the allowlist, over HTTPS: the CONNECT is refused, nothing loads.
await fresh();
let refusedHTTPS = '';
try {
  await page.goto(env.OTHER_HTTPS, { timeout: 60_000 });
} catch (err) {
  refusedHTTPS = String(err.message).split('\n')[0];
}
log('refused HTTPS page:', refusedHTTPS);
assert.match(refusedHTTPS, /net::ERR_TUNNEL_CONNECTION_FAILED/);

// Not on the allowlist, over HTTP: the proxy's 403 with the reason.
await fresh();
res = await page.goto(env.OTHER_HTTP, { timeout: 60_000 });
const refusedHTTP = (await page.textContent('body')).trim();
log('refused HTTP page:', res.status(), refusedHTTP);
assert.equal(res.status(), 403);
assert.match(refusedHTTP, /other\.test is not in network\.allow/);

// Credential injection: the outside server got the header.
await fresh();
res = await page.goto(env.SECRET_URL, { timeout: 60_000 });
const secret = await text();
log('secret page:', res.status(), secret);
assert.equal(res.status(), 200);
assert.equal(secret, 'auth-ok sni=secret.test');
const html = await page.content();

await page.close();
await browser.close();
console.log(JSON.stringify({ ok: true, web, refusedHTTPS, refusedHTTP, secret, html }));
