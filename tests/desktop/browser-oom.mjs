// A tab that eats memory, in headless Chromium in a sandbox of the browser
// image (driven over CDP through airlock's ports relay): one tab shows the
// page served inside the sandbox, another allocates (and touches) memory
// until something kills it. The hog's renderer must die, and nothing else:
// the browser answers, the other tab still reads its DOM, and a new tab loads
// the page again.
//
//   AIRLOCK_KEY=... CDP_URL=ws://... node browser-oom.mjs
//
// The last line printed is a JSON summary for browserlimits_linux_test.go.
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const log = (...a) => console.error('[browser-oom]', ...a);
const browser = await chromium.connectOverCDP(process.env.CDP_URL, {
  headers: { Authorization: `Bearer ${process.env.AIRLOCK_KEY}` },
  timeout: 120_000,
});
const context = browser.contexts()[0] ?? (await browser.newContext());
const calm = await context.newPage();
await calm.goto('http://127.0.0.1:8000/', { timeout: 60_000 });
assert.equal(await calm.title(), 'airlock-page');

const hog = await context.newPage();
const crashed = new Promise((resolve) => hog.once('crash', () => resolve(true)));
const started = Date.now();
// 32 MiB at a time, every page written, kept: outside V8's heap, so that
// the process grows until the memory limit, not until V8's own heap limit.
const ended = await hog
  .evaluate(() => {
    const keep = [];
    for (;;) keep.push(new Uint8Array(32 << 20).fill(7));
  })
  .then(() => 'returned', (err) => String(err.message).split('\n')[0]);
log('the hog ended:', ended, 'after', Date.now() - started, 'ms');
const crash = await Promise.race([crashed, new Promise((r) => setTimeout(() => r(false), 60_000))]);
assert.ok(crash, `the hog's tab did not crash (evaluate: ${ended})`);

// Everything else lives.
const version = browser.version();
assert.equal(await calm.title(), 'airlock-page');
await calm.click('#f');
await calm.keyboard.type('ok');
assert.equal(await calm.inputValue('#f'), 'ok');
const fresh = await context.newPage();
await fresh.goto('http://127.0.0.1:8000/', { timeout: 60_000 });
assert.equal(await fresh.title(), 'airlock-page');
await fresh.close();
await calm.close();
await browser.close();
console.log(JSON.stringify({ ok: true, ended, crash, version }));
