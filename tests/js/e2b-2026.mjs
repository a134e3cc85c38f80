// Drives the official `e2b` package (newest release in package.json),
// unchanged, through E2B's 2026 surface against an airlock server:
// snapshots and filesystem-only pause. Needs E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY and E2B_OTHER_API_KEY (a second key: the hostile tenant) and
// E2B_RUNTIME (native or gvisor: the server's --default-runtime). Every
// step asserts its result; the first failure exits non-zero naming the
// step. Driven by e2b/sdk2026_linux_test.go.
import { createServer } from 'node:http'
import { Sandbox, Secret, Volume, NotFoundError } from 'e2b'
import { StepError, assert, eq, progress, step } from './steps.mjs'

const runtime = process.env.E2B_RUNTIME || 'native'
for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'E2B_OTHER_API_KEY']) {
  if (!process.env[v]) {
    console.error(`e2b-2026: ${v} is not set`)
    process.exit(2)
  }
}
const other = { apiKey: process.env.E2B_OTHER_API_KEY }
// gVisor declares memory snapshots (runtime/tier Caps.MemorySnapshot);
// native does not.
const memoryKind = runtime === 'gvisor' ? 'memory' : 'filesystem'

const cleanup = []


async function fails(p, what) {
  try {
    await p
  } catch (e) {
    return e
  }
  throw new StepError(`${what}: expected an error, but it succeeded`)
}


async function created(p) {
  const s = await p
  cleanup.push(s)
  return s
}

// rawSnapshots lists the key's snapshots as the server answers them
// (with airlock's "kind", which the SDK drops).
async function rawSnapshots(apiKey) {
  const res = await fetch(`${process.env.E2B_API_URL}/snapshots`, { headers: { 'X-API-KEY': apiKey } })
  assert(res.status === 200, `GET /snapshots: ${res.status}`)
  return await res.json()
}

async function until(what, f, ms = 120_000) {
  const end = Date.now() + ms
  for (;;) {
    const v = await f()
    if (v) return v
    if (Date.now() > end) throw new StepError(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 250))
  }
}

async function sleepers(sbx) {
  return (await sbx.commands.list()).filter((p) => p.cmd.includes('sleep') || p.args.join(' ').includes('sleep 987'))
}

async function main() {
  let orig, snap
  await step('createSnapshot of a sandbox with a file and a running process', async () => {
    orig = await created(Sandbox.create({ timeoutMs: 600_000 }))
    await orig.files.write('/home/user/state.txt', 'before snapshot')
    await orig.commands.run('mkdir -p /home/user/dir && echo nested > /home/user/dir/n.txt')
    await orig.commands.run('sleep 987', { background: true })
    snap = await orig.createSnapshot()
    assert(typeof snap.snapshotId === 'string' && snap.snapshotId.length > 0, `snapshotId: ${JSON.stringify(snap)}`)
    const mine = await Sandbox.listSnapshots().nextItems()
    eq(mine.map((s) => s.snapshotId), [snap.snapshotId], 'listSnapshots')
    const raw = await rawSnapshots(process.env.E2B_API_KEY)
    eq(raw[0].kind, memoryKind, `the snapshot's kind on ${runtime}`)
    const bySandbox = await orig.listSnapshots().nextItems()
    eq(bySandbox.length, 1, 'sandbox.listSnapshots')
  })

  await step('one snapshot, many sandboxes: each has the files, independently', async () => {
    await orig.files.write('/home/user/state.txt', 'changed after the snapshot')
    const [a, b] = await Promise.all([created(Sandbox.create(snap.snapshotId)), created(Sandbox.create(snap.snapshotId))])
    assert(a.sandboxId !== b.sandboxId && a.sandboxId !== orig.sandboxId, 'distinct sandboxes')
    eq(await a.files.read('/home/user/state.txt'), 'before snapshot', 'file in the first copy')
    eq(await b.files.read('/home/user/dir/n.txt'), 'nested\n', 'nested file in the second copy')
    await a.files.write('/home/user/state.txt', 'a')
    eq(await b.files.read('/home/user/state.txt'), 'before snapshot', 'the copies are independent')
    const procs = await sleepers(b)
    if (memoryKind === 'memory') {
      assert(procs.length === 1, `a memory snapshot keeps the running process: ${JSON.stringify(procs)}`)
    } else {
      eq(procs.length, 0, 'a filesystem snapshot has no processes')
    }
    await a.kill()
    await b.kill()
    // A create that sets its own envs gets the files copy, where they
    // apply (a fork would have the original's environment).
    const c = await created(Sandbox.create(snap.snapshotId, { envs: { MINE: 'yes' } }))
    eq((await c.commands.run('echo $MINE')).stdout, 'yes\n', 'the create\'s envs apply')
    eq(await c.files.read('/home/user/state.txt'), 'before snapshot', 'and the files are the snapshot\'s')
    eq((await sleepers(c)).length, 0, 'a files copy has no processes')
    await c.kill()
  })

  await step('hostile key: cannot list, use or delete another key\'s snapshot', async () => {
    eq(await Sandbox.listSnapshots(other).nextItems(), [], 'the other key lists none')
    eq(await rawSnapshots(other.apiKey), [], 'the other key lists none (raw)')
    const err = await fails(Sandbox.create(snap.snapshotId, other), 'create from another key\'s snapshot')
    assert(/not found/i.test(err.message), `create from another key's snapshot: ${err.name}: ${err.message}`)
    eq(await Sandbox.deleteSnapshot(snap.snapshotId, other), false, 'deleteSnapshot by another key')
    const err2 = await fails(Sandbox.createSnapshot(orig.sandboxId, other), 'snapshot of another key\'s sandbox')
    assert(err2 instanceof NotFoundError || /not found/i.test(err2.message), `snapshot of another key's sandbox: ${err2.name}: ${err2.message}`)
    eq((await Sandbox.listSnapshots().nextItems()).length, 1, 'the owner still has it')
  })

  await step('the snapshot survives its sandbox (as a filesystem snapshot) and can be named', async () => {
    const named = await orig.createSnapshot({ name: 'my-snap' })
    assert(named.names.length === 1 && named.names[0].startsWith('my-snap'), `names: ${JSON.stringify(named.names)}`)
    await orig.kill()
    const raw = await rawSnapshots(process.env.E2B_API_KEY)
    eq(raw.map((s) => s.kind), ['filesystem', 'filesystem'], 'kinds once the sandbox is gone')
    const c = await created(Sandbox.create(snap.snapshotId))
    eq(await c.files.read('/home/user/state.txt'), 'before snapshot', 'file from the first snapshot')
    const d = await created(Sandbox.create('my-snap'))
    eq(await d.files.read('/home/user/state.txt'), 'changed after the snapshot', 'file from the named snapshot')
    eq((await c.getInfo()).templateId, snap.snapshotId, "a copy's template is the snapshot")
    await c.kill()
    await d.kill()
    eq(await Sandbox.deleteSnapshot(named.snapshotId), true, 'delete the named snapshot')
  })

  await step('deleteSnapshot: gone from the list, a create from it is not found, a second delete is false', async () => {
    eq(await Sandbox.deleteSnapshot(snap.snapshotId), true, 'deleteSnapshot')
    eq(await Sandbox.listSnapshots().nextItems(), [], 'list after delete')
    const err = await fails(Sandbox.create(snap.snapshotId), 'create from a deleted snapshot')
    assert(/not found/i.test(err.message), `create from a deleted snapshot: ${err.message}`)
    eq(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'second delete')
  })

  await step('secrets: stored per key, named in network.rules, resolved at egress, never inside', async () => {
    const value = 'sk-test-' + Math.random().toString(36).slice(2)
    const heard = []
    const server = createServer((req, res) => { heard.push(req.headers['x-api-key']); res.end('ok') })
    await new Promise((r) => server.listen(0, '127.0.0.1', r))
    const port = server.address().port
    try {
      const info = await Secret.create('scenario-token', value, { metadata: { purpose: 'test' } })
      eq([info.name, info.version], ['scenario-token', 1], 'created')
      assert(!JSON.stringify(await Secret.list().nextItems()).includes(value), 'a listing carries the value')
      eq(await Secret.list(other).nextItems(), [], 'the other key lists none')
      eq(await Secret.exists('scenario-token', other), false, 'the other key cannot see it')
      eq(await Secret.destroy(info.secretId, other), false, 'the other key cannot delete it')
      const rules = { '127.0.0.1': [{ transform: { headers: { 'X-Api-Key': Secret.fill('scenario-token') } } }] }
      const network = { denyOut: ['0.0.0.0/0'], allowOut: ['127.0.0.1'], rules }
      await fails(Sandbox.create({ ...other, network }), "the other key's sandbox naming the secret")
      const s = await created(Sandbox.create({ network }))
      const r = await s.commands.run(`curl -fsS -m 20 --noproxy '' http://127.0.0.1:${port}/`)
      eq(r.stdout, 'ok', 'request through the proxy')
      eq(heard, [value], 'the server got the secret')
      const inside = await s.commands.run("env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; true")
      assert(!inside.stdout.includes(value), 'the secret is inside the sandbox')
      await s.kill()
      eq(await Secret.destroy('scenario-token'), true, 'destroy')
    } finally {
      server.close()
    }
  })

  await step('volumes: made per key, mounted in one sandbox after another, not another key\'s', async () => {
    const vol = await Volume.create('scenario-vol')
    eq(vol.name, 'scenario-vol', 'name')
    eq((await Volume.list(other)).length, 0, 'the other key lists none')
    eq(await Volume.destroy(vol.volumeId, other), false, 'the other key cannot delete it')
    await fails(Sandbox.create({ ...other, volumeMounts: { '/home/user/vol': vol } }), "the other key mounting it")
    const a = await created(Sandbox.create({ volumeMounts: { '/home/user/vol': vol } }))
    await a.commands.run('echo persisted > /home/user/vol/f.txt')
    await a.kill()
    const b = await created(Sandbox.create({ volumeMounts: { '/mnt/vol': 'scenario-vol' } }))
    eq((await b.commands.run('cat /mnt/vol/f.txt')).stdout, 'persisted\n', 'the file in the next sandbox')
    await b.kill()
    eq(await Volume.destroy(vol.volumeId), true, 'destroy')
  })

  await step('envd 0.6: file metadata on write, entries in watch events', async () => {
    const s = await created(Sandbox.create())
    const w = await s.files.write('/home/user/meta.txt', 'x', { metadata: { Author: 'alice', 'build-id': '42' } })
    eq(w.metadata, { author: 'alice', 'build-id': '42' }, 'metadata in the write answer (keys lower-cased, as envd)')
    eq((await s.files.getInfo('/home/user/meta.txt')).metadata, { author: 'alice', 'build-id': '42' }, 'metadata in getInfo')
    const listed = (await s.files.list('/home/user')).find((e) => e.name === 'meta.txt')
    eq(listed.metadata, { author: 'alice', 'build-id': '42' }, 'metadata in list')
    await s.files.write('/home/user/meta.txt', 'y')
    eq((await s.files.getInfo('/home/user/meta.txt')).metadata ?? {}, {}, 'a write without metadata clears it, as envd')
    const events = []
    const h = await s.files.watchDir('/home/user', (e) => events.push(e), { includeEntry: true })
    await s.files.write('/home/user/watched.txt', 'hello')
    await until('a write event with its entry', async () => events.some((e) => e.name === 'watched.txt' && e.entry?.size === 5))
    await h.stop()
    await s.kill()
  })

  await step('pause({keepMemory: false}): files kept, processes stopped; connect brings it back', async () => {
    const s = await created(Sandbox.create({ timeoutMs: 300_000 }))
    await s.files.write('/home/user/kept.txt', 'kept')
    await s.commands.run('sleep 987', { background: true })
    eq((await sleepers(s)).length, 1, 'the background process runs')
    eq(await s.pause({ keepMemory: false }), true, 'pause')
    eq((await s.getInfo()).state, 'paused', 'state')
    const back = await Sandbox.connect(s.sandboxId)
    eq(await back.files.read('/home/user/kept.txt'), 'kept', 'the file after resume')
    eq((await sleepers(back)).length, 0, 'no process after a filesystem-only pause')
    eq((await back.commands.run('echo alive')).stdout, 'alive\n', 'new commands run')
    await back.kill()
  })

  await step('connect({onResume: "reboot"}) of a memory pause drops its processes', async () => {
    const s = await created(Sandbox.create({ timeoutMs: 300_000 }))
    await s.files.write('/home/user/kept.txt', 'kept')
    await s.commands.run('sleep 987', { background: true })
    await s.pause()
    const back = await Sandbox.connect(s.sandboxId, { onResume: 'reboot' })
    eq(await back.files.read('/home/user/kept.txt'), 'kept', 'the file after reboot')
    eq((await sleepers(back)).length, 0, 'no process after reboot')
    await back.kill()
  })

  await step('lifecycle onTimeout {pause, keepMemory: false}: the timeout pauses it without its processes', async () => {
    const s = await created(Sandbox.create({ timeoutMs: 4_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } }))
    await s.files.write('/home/user/kept.txt', 'kept')
    await s.commands.run('sleep 987', { background: true })
    await until('the timeout to pause it', async () => (await Sandbox.getInfo(s.sandboxId)).state === 'paused')
    const back = await Sandbox.connect(s.sandboxId)
    eq(await back.files.read('/home/user/kept.txt'), 'kept', 'the file after resume')
    eq((await sleepers(back)).length, 0, 'no process after the filesystem-only pause')
    await back.kill()
  })
}

try {
  await main()
  console.log('e2b-2026: all steps passed')
} catch (e) {
  console.error(`FAIL ${progress.current}: ${e instanceof StepError ? e.message : e.stack || e}`)
  process.exitCode = 1
} finally {
  for (const s of cleanup) {
    try {
      await s.kill()
    } catch {}
  }
  try {
    for (const s of await Sandbox.listSnapshots().nextItems()) await Sandbox.deleteSnapshot(s.snapshotId)
  } catch {}
}
