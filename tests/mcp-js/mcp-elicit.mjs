// Answers airlock's approval requests through MCP elicitation with the
// official TypeScript SDK (see mcp/approval_linux_test.go).
//
//   AIRLOCK_KEY=al_... ANSWER=accept|decline node mcp-elicit.mjs URL
//
// It declares the elicitation capability, makes a directory, runs
// `rm -rf` on it (held by the server's approval policy, so the server asks
// this client), answers ANSWER, and then checks whether the directory is
// still there. The last line printed is a JSON summary:
// {"ok":true,"elicited":[messages],"is_error":bool,"text":"...","exists":bool,"sandbox":"sb-..."}.
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const [target] = process.argv.slice(2);
const answer = process.env.ANSWER;
assert.ok(answer === 'accept' || answer === 'decline', 'ANSWER must be accept or decline');
const log = (...a) => console.error('[mcp-elicit]', ...a);

const transport = new StreamableHTTPClientTransport(new URL(target), {
  requestInit: { headers: { Authorization: `Bearer ${process.env.AIRLOCK_KEY}` } },
});
const client = new Client({ name: 'airlock-elicit-test', version: '1.0.0' }, { capabilities: { elicitation: {} } });
const elicited = [];
client.setRequestHandler(ElicitRequestSchema, async (req) => {
  elicited.push(req.params.message);
  log('elicitation:', req.params.message, '->', answer);
  if (answer === 'accept') return { action: 'accept', content: { reason: 'the test approves' } };
  return { action: 'decline' };
});
await client.connect(transport);

const text = (res) => res.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');
const run = async (command) => {
  const res = await client.callTool({ name: 'run_command', arguments: { command } });
  log(command, '->', res.isError ? 'ERROR' : 'ok', JSON.stringify(text(res)));
  return res;
};

let res = await run('mkdir -p /workspace/d && touch /workspace/d/f && echo made');
assert.ok(!res.isError, `setup failed: ${text(res)}`);
assert.equal(elicited.length, 0, 'a command no rule names was held');
const held = await run('rm -rf /workspace/d');
res = await run('test -e /workspace/d/f && echo exists || echo gone');
assert.ok(!res.isError, `check failed: ${text(res)}`);
const exists = text(res).includes('exists');
// The sandbox the held command was for, as the elicitation named it.
const sandbox = ((elicited[0] || '').match(/in sandbox (sb-[A-Za-z0-9-]+)/) || ['', ''])[1];
await client.close();
console.log(JSON.stringify({ ok: true, elicited, is_error: held.isError === true, text: text(held), exists, sandbox }));
