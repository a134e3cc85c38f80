// playwright-core on the host drives headless Chromium in a sandbox of the
// browser image over the DevTools protocol, through airlock's ports relay
// (the WebSocket at /v1/sandboxes/ID/ports/9222/devtools/browser/...,
// authorized by the API key): it loads a page served inside the sandbox
// (testdata/page.py), clicks its text field, types, and reads the DOM.
//
//   AIRLOCK_KEY=... CDP_URL=ws://.../v1/sandboxes/ID/ports/9222/devtools/browser/UUID node browser-cdp.mjs
//
// The last line printed is a JSON summary for browser_linux_test.go.
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const log = (...a) => console.error('[browser-cdp]', ...a);
const browser = await chromium.connectOverCDP(process.env.CDP_URL, {
  headers: { Authorization: `Bearer ${process.env.AIRLOCK_KEY}` },
  timeout: 120_000,
});
log('connected, version', browser.version());
const context = browser.contexts()[0] ?? (await browser.newContext());
const page = await context.newPage();
await page.goto('http://127.0.0.1:8000/', { timeout: 60_000 });
assert.equal(await page.title(), 'airlock-page');
await page.click('#f');
await page.keyboard.type('cdp');
await page.keyboard.press('Enter');
const value = await page.inputValue('#f');
log('field value', JSON.stringify(value));
assert.equal(value, 'cdp');
const box = await page.locator('#f').boundingBox();
assert.ok(box && box.x === 100 && box.y === 100, `field at ${JSON.stringify(box)}`);
// The page logs each key with a request of its own, one after another:
// closing it before the last has been answered cancels the rest (seen
// once in CI under load, the log short of keys).
await page.evaluate(() => chain.then(() => true));
await page.close();
await browser.close();
console.log(JSON.stringify({ ok: true, value, version: browser.version() }));
