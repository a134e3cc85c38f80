// Drives airlock with E2B Desktop's SDK (@e2b/desktop), unchanged: the
// server is given by E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY and runs
// with --e2b-domain, so that getHost (the stream's URL) names
// PORT-SANDBOXID.DOMAIN. Driven by e2b_linux_test.go, which gets the
// screenshots (OUT_DIR/before.png, after.png, window.json) and, on a line
// {"stream": URL, "token": ...}, loads the stream in headless Chromium
// through a TLS proxy; it then writes a line to stdin and this script
// stops the stream and kills the sandbox. The last line is a JSON summary.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { Sandbox } from '@e2b/desktop';

const out = process.env.OUT_DIR;
const log = (...a) => console.error('[e2b-desktop]', ...a);
let current = '(setup)';
async function step(name, fn) {
  current = name;
  const t0 = Date.now();
  const r = await fn();
  log(`${name}: ok in ${Date.now() - t0} ms`);
  return r;
}
process.on('unhandledRejection', (e) => {
  console.error(`[e2b-desktop] step "${current}" failed:`, e);
  process.exit(1);
});

const desktop = await step('create desktop', () => Sandbox.create('desktop', { timeoutMs: 900_000 }));
const summary = { ok: false, sandbox: desktop.sandboxId };
try {
  const size = await step('getScreenSize', () => desktop.getScreenSize());
  assert.deepEqual(size, { width: 1024, height: 768 });
  await step('moveMouse', () => desktop.moveMouse(210, 320));
  assert.deepEqual(await step('getCursorPosition', () => desktop.getCursorPosition()), { x: 210, y: 320 });

  // create() returns once XFCE's processes run; its panel maps (and its
  // settings daemon applies the keyboard map) a little later: typing
  // before that can lose keys.
  await step('wait for the panel', () => desktop.commands.run("timeout 110 sh -c 'until xdotool search --onlyvisible --class xfce4-panel >/dev/null 2>&1; do sleep 0.5; done'", { timeoutMs: 120_000 }));

  // An xterm with bash; its window's place on the screen.
  await step('open xterm', () => desktop.commands.run('xterm -T e2b-term -geometry 70x12+150+120 -e bash --norc', { background: true, timeoutMs: 0 }));
  await step('wait for its window', () => desktop.commands.run("timeout 110 sh -c 'until xwininfo -name e2b-term >/dev/null 2>&1; do sleep 0.5; done'", { timeoutMs: 120_000 }));
  // xwininfo's absolute position (xdotool's getwindowgeometry counts the
  // window manager's frame twice).
  const info = (await desktop.commands.run('xwininfo -name e2b-term')).stdout;
  const num = (re) => Number(info.match(re)[1]);
  const g = { X: num(/Absolute upper-left X:\s+(\d+)/), Y: num(/Absolute upper-left Y:\s+(\d+)/), WIDTH: num(/Width:\s+(\d+)/), HEIGHT: num(/Height:\s+(\d+)/) };
  writeFileSync(`${out}/window.json`, JSON.stringify(g));
  await step('leftClick', () => desktop.leftClick(g.X + Math.floor(g.WIDTH / 2), g.Y + Math.floor(g.HEIGHT / 2)));
  await new Promise((r) => setTimeout(r, 1000));
  const before = await step('screenshot', () => desktop.screenshot());
  assert.ok(before instanceof Uint8Array && before.length > 1000, 'screenshot bytes');
  writeFileSync(`${out}/before.png`, before);

  // Type a command that sets the window's title, then read the title.
  await step('write', () => desktop.write("printf '\\033]0;typed-by-e2b\\007'; echo typed > /tmp/e2b-typed"));
  await step('press', () => desktop.press('enter'));
  let title = '';
  await step('the window title shows the typed text', async () => {
    for (let i = 0; i < 120 && title !== 'typed-by-e2b'; i++) {
      title = await desktop.getWindowTitle(await desktop.getCurrentWindowId());
      if (title !== 'typed-by-e2b') await new Promise((r) => setTimeout(r, 500));
    }
    assert.equal(title, 'typed-by-e2b');
  });
  const after = await step('screenshot after typing', () => desktop.screenshot());
  writeFileSync(`${out}/after.png`, after);

  await step('doubleClick', () => desktop.doubleClick(g.X + 40, g.Y + 40));
  await step('rightClick', () => desktop.rightClick(900, 700));
  await step('press Escape', () => desktop.press('escape'));
  await step('scroll', () => desktop.scroll('down', 2));
  await step('drag', () => desktop.drag([20, 700], [60, 720]));
  assert.deepEqual(await desktop.getCursorPosition(), { x: 60, y: 720 }, 'cursor after the drag');

  // The stream: x11vnc + noVNC on 6080, its URL on getHost(6080).
  await step('stream.start', () => desktop.stream.start());
  const url = desktop.stream.getUrl();
  assert.match(url, new RegExp(`^https://6080-${desktop.sandboxId}\\.`));
  console.log(JSON.stringify({ stream: url, token: desktop.trafficAccessToken ?? '' }));
  const rl = createInterface({ input: process.stdin });
  await step('the stream is watched', () => new Promise((r) => rl.once('line', r)));
  rl.close();
  await step('stream.stop', () => desktop.stream.stop());
  summary.ok = true;
  summary.title = title;
} finally {
  await desktop.kill().catch((e) => log('kill:', e));
}
console.log(JSON.stringify(summary));
