// Drives airlock's MCP server with the official TypeScript SDK.
//
//   node mcp-scenario.mjs stdio BIN [ARGS...]   spawn `BIN mcp ARGS...` and talk over its stdio
//   node mcp-scenario.mjs http URL              talk to URL (…/mcp) with AIRLOCK_KEY as bearer token
//
// REQUIRE_RUN_CODE=1 fails when the server does not offer run_code.
// The last line printed is a JSON summary for mcp/js_linux_test.go:
// {"ok":true,"sandbox":"sb-…","tools":[…],"run_code":"tested"|"absent"}.
import assert from 'node:assert/strict';
import zlib from 'node:zlib';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [mode, target, ...rest] = process.argv.slice(2);
const log = (...a) => console.error('[mcp-js]', ...a);

let transport;
if (mode === 'stdio') {
  transport = new StdioClientTransport({ command: target, args: ['mcp', ...rest], stderr: 'inherit' });
} else if (mode === 'http') {
  const key = process.env.AIRLOCK_KEY;
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  transport = new StreamableHTTPClientTransport(new URL(target), { requestInit: { headers } });
} else {
  console.error('usage: mcp-scenario.mjs stdio BIN [ARGS...] | http URL');
  process.exit(2);
}

const client = new Client({ name: 'airlock-mcp-js-test', version: '1.0.0' });
await client.connect(transport);
log('connected', mode, 'protocol', transport.protocolVersion ?? '(negotiated)');

const text = (res) => res.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');
async function call(name, args = {}) {
  const res = await client.callTool({ name, arguments: args });
  log(name, JSON.stringify(args).slice(0, 80), '->', res.isError ? 'ERROR' : 'ok', JSON.stringify(text(res).slice(0, 120)));
  return res;
}
async function ok(name, args) {
  const res = await call(name, args);
  assert.ok(!res.isError, `${name} failed: ${text(res)}`);
  return res;
}
async function fails(name, args) {
  const res = await call(name, args);
  assert.equal(res.isError, true, `${name} should be a tool error, got: ${text(res)}`);
  return res;
}

// checkPNG validates a PNG fully: signature, chunk CRCs, IHDR, and that
// the inflated image data has exactly the size IHDR implies.
function checkPNG(buf) {
  assert.deepEqual([...buf.subarray(0, 8)], [137, 80, 78, 71, 13, 10, 26, 10], 'PNG signature');
  let off = 8;
  let ihdr;
  const idat = [];
  let sawEnd = false;
  while (off < buf.length) {
    const len = buf.readUInt32BE(off);
    const type = buf.toString('latin1', off + 4, off + 8);
    const data = buf.subarray(off + 8, off + 8 + len);
    const crc = buf.readUInt32BE(off + 8 + len);
    assert.equal(zlib.crc32(buf.subarray(off + 4, off + 8 + len)) >>> 0, crc, `CRC of ${type}`);
    if (type === 'IHDR') ihdr = { width: data.readUInt32BE(0), height: data.readUInt32BE(4), depth: data[8], color: data[9], interlace: data[12] };
    if (type === 'IDAT') idat.push(data);
    off += 12 + len;
    if (type === 'IEND') { sawEnd = true; break; }
  }
  assert.ok(ihdr && sawEnd && idat.length > 0, 'IHDR, IDAT and IEND present');
  const channels = { 0: 1, 2: 3, 3: 1, 4: 2, 6: 4 }[ihdr.color];
  assert.ok(channels, `color type ${ihdr.color}`);
  const raw = zlib.inflateSync(Buffer.concat(idat));
  if (ihdr.interlace === 0) {
    const stride = Math.ceil((ihdr.width * channels * ihdr.depth) / 8);
    assert.equal(raw.length, ihdr.height * (1 + stride), 'inflated image data size');
  }
  return ihdr;
}

// makePNG encodes a small RGB image.
function makePNG(width, height) {
  const chunk = (type, data) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(data.length);
    const td = Buffer.concat([Buffer.from(type, 'latin1'), data]);
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(zlib.crc32(td) >>> 0);
    return Buffer.concat([len, td, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8; ihdr[9] = 2; // 8-bit RGB
  const raw = Buffer.alloc(height * (1 + width * 3));
  for (let y = 0; y < height; y++) for (let x = 0; x < width; x++) raw[y * (1 + width * 3) + 1 + x * 3] = (x * 255) / width;
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk('IHDR', ihdr), chunk('IDAT', zlib.deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}

const { tools } = await client.listTools();
const names = tools.map((t) => t.name).sort();
log('tools', names.join(' '));
for (const want of ['run_command', 'write_file', 'read_file', 'list_files', 'create_sandbox', 'list_sandboxes', 'kill_sandbox']) {
  assert.ok(names.includes(want), `missing tool ${want}`);
}
for (const t of tools) {
  assert.equal(t.inputSchema.type, 'object', `${t.name} input schema`);
  assert.ok(t.description.length > 60, `${t.name} description`);
}

// Commands and files share the session's sandbox.
assert.equal(text(await ok('run_command', { command: 'echo hello from $(id -un)' })), 'hello from user\n');
await ok('write_file', { path: 'notes/a.txt', content: 'line one\n' });
assert.equal(text(await ok('read_file', { path: 'notes/a.txt' })), 'line one\n');
assert.match(text(await ok('list_files', { depth: 2 })), /f +9 notes\/a\.txt/);
assert.equal(text(await ok('run_command', { argv: ['wc', '-l', 'notes/a.txt'] })), '1 notes/a.txt\n');

// An image file comes back as image content with a valid PNG.
await ok('write_file', { path: 'img.png', content: makePNG(33, 21).toString('base64'), encoding: 'base64' });
const img = await ok('read_file', { path: 'img.png' });
assert.equal(img.content[0].type, 'image');
assert.equal(img.content[0].mimeType, 'image/png');
const dims = checkPNG(Buffer.from(img.content[0].data, 'base64'));
assert.deepEqual([dims.width, dims.height], [33, 21]);

// run_code: state across cells, and a matplotlib figure as an image.
let runCode = 'absent';
if (names.includes('run_code')) {
  await ok('run_code', { language: 'python', code: 'x = 41\nimport math' });
  assert.match(text(await ok('run_code', { language: 'python', code: 'x + 1' })), /\b42\b/);
  const plot = await ok('run_code', {
    language: 'python',
    code: 'import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(4, 3), dpi=50)\nplt.plot([1, 2, 3], [x, 0, x])\nplt.show()',
  });
  const pics = plot.content.filter((c) => c.type === 'image');
  assert.equal(pics.length, 1, `one figure, got ${JSON.stringify(plot.content.map((c) => c.type))}`);
  assert.equal(pics[0].mimeType, 'image/png');
  const p = checkPNG(Buffer.from(pics[0].data, 'base64'));
  assert.deepEqual([p.width, p.height], [200, 150]);
  const boom = await fails('run_code', { language: 'python', code: '1/0' });
  assert.match(text(boom), /ZeroDivisionError/);
  assert.match(text(await ok('run_code', { language: 'python', code: 'print(x)' })), /41/);
  await fails('run_code', { language: 'python', code: "open('/etc/shadow').read()" });
  await ok('run_code', { language: 'javascript', code: 'let n = 20' });
  assert.match(text(await ok('run_code', { language: 'javascript', code: 'n * 2 + 2' })), /\b42\b/);
  runCode = 'tested';
} else {
  assert.ok(process.env.REQUIRE_RUN_CODE !== '1', 'run_code is required but not offered');
  log('run_code: not offered by this server (no interpreter): not tested');
}

// Hostile calls are tool errors; the server stays healthy.
await fails('run_command', { command: "bash -c ':(){ :|:& };:'" });
assert.match(text(await fails('run_command', { command: 'cat /etc/shadow' })), /No such file/);
await fails('read_file', { path: '/etc/shadow' });
await fails('run_command', { command: 'sleep 30', timeout_seconds: 0.5 });
assert.equal(text(await ok('run_command', { command: 'echo still healthy' })), 'still healthy\n');

const list = text(await ok('list_sandboxes'));
const own = list.split('\n').find((l) => l.includes("(this session's own sandbox)"));
assert.ok(own, `own sandbox in ${list}`);
const sandbox = own.split(/\s+/)[0];

// Disconnect: an HTTP client ends its session explicitly, a stdio client
// closes the server's stdin.
if (mode === 'http') await transport.terminateSession();
await client.close();
console.log(JSON.stringify({ ok: true, mode, sandbox, tools: names, run_code: runCode }));
